"""Tensor ``if``/``elif``/``else`` -> ``torch.where`` (both branches run) or ``torch.cond`` (one runs).

An ``if`` on a tensor test whose branches only assign pure expressions to names, log, or return one
value (an early ``if c: return a`` followed by the rest of the function included) becomes
``torch.where`` when neither branch draws random numbers or can raise on some data and nothing needs
gradients; otherwise ``torch.cond``. An ``if`` nested in a branch (``elif`` included) whose branches only
assign side-effect-free values is lowered first (:meth:`BranchRules.lower`): both of its branches run
and ``runtime.pick`` selects. In a test, ``not t`` stays a tensor and a float ``.item()`` compared (or
added, subtracted, multiplied, then compared) stays in the graph as float64, which gives exactly
Python's answer (``analysis.exact_items``).
"""

from __future__ import annotations

import ast
import copy

from .analysis import (
    TYPE_PARAMS,
    Purity,
    Walker,
    exact_items,
    fired_stmt,
    guard_test,
    loaded_names,
    located,
    maybe_tensor_test,
    name_node,
    names_stored,
    plain_target,
    purity,
    rt_call,
)
from .effects import arg_purity, log_kind


class BranchRules(Walker):
    """The if/else rules, mixed into :class:`~.statements.Block`."""

    def if_convert(self, s: ast.If, defined: set[str], early: bool = False) -> list[ast.stmt] | None:
        T, F = s.body, s.orelse
        returns = bool(T) and isinstance(T[-1], ast.Return)
        if returns != (bool(F) and isinstance(F[-1], ast.Return)):
            return None
        pure = Purity()
        logs = False
        for branch in (T, F):
            bound = set(defined)
            for j, st in enumerate(branch):
                if isinstance(st, ast.Pass):
                    continue
                if isinstance(st, ast.Return) and j == len(branch) - 1 and st.value is not None:
                    purity(st.value, self.ctx, pure)
                elif isinstance(st, ast.Assign) and len(st.targets) == 1 and plain_target(st.targets[0]):
                    purity(st.value, self.ctx, pure)
                    bound |= names_stored([st])
                elif isinstance(st, ast.If) and self.nested_ok(st, pure, bound):
                    bound |= names_stored([st])
                elif isinstance(st, ast.Expr) and isinstance(st.value, ast.Call) and log_kind(st.value, self.ctx):
                    logs = True
                    for x in st.value.args:
                        arg_purity(x, self.ctx, pure)
                else:
                    return None
        speculate = not (pure.random or pure.may_fail)  # may both branches run? else only torch.cond
        if not pure.ok or (logs and not speculate):
            return None
        if returns:
            outputs = ["_mend_ret"]
        else:
            st_t, st_f = names_stored(T), names_stored(F)
            outputs = []
            inside: dict[str, int] = {}
            for x in loaded_names(s):
                inside[x.id] = inside.get(x.id, 0) + 1
            for n in sorted(st_t | st_f):
                if n in st_t and n in st_f or n in defined:
                    outputs.append(n)
                elif self.loads.get(n, 0) > inside.get(n, 0):
                    return None  # bound on one side only and read later: the rewrite could not keep it unbound
            if not outputs and not (logs and speculate):
                return None
        p = self.ctx.fresh("p")
        k = self.ctx.counter
        t_body, t_outs = self.branch(T, f"_mend_t{k}_", outputs, (p, 1))
        f_body, f_outs = self.branch(F, f"_mend_f{k}_", outputs, (p, -1))
        tt = ast.Tuple([name_node(x) for x in t_outs], ast.Load())
        ff = ast.Tuple([name_node(x) for x in f_outs], ast.Load())

        def assign(value: ast.expr) -> ast.stmt:
            if returns:
                return ast.Return(ast.Subscript(value, ast.Constant(0), ast.Load()))
            return ast.Assign([ast.Tuple([name_node(x, True) for x in outputs], ast.Store())], value)

        fns: list[ast.stmt] = []
        if not logs:
            for name, body, outs in ((f"_mend_tfn{k}", t_body, tt), (f"_mend_ffn{k}", f_body, ff)):
                fns.append(
                    ast.FunctionDef(
                        name,
                        ast.arguments([], [], None, [], [], None, []),
                        copy.deepcopy(body) + [ast.Return(copy.deepcopy(outs))],
                        [],
                        None,
                        **TYPE_PARAMS,
                    )
                )
            early_txt = "early return " if early else ""
            use_cond = [
                fired_stmt(self.ctx.note(s, f"{early_txt}if on a tensor -> torch.cond"), s),
                assign(rt_call("cond", name_node(p), name_node(f"_mend_tfn{k}"), name_node(f"_mend_ffn{k}"))),
            ]
        select = [assign(ast.IfExp(name_node(p), copy.deepcopy(tt), copy.deepcopy(ff)))]
        if not outputs:  # the branches only log: each log is deferred with the test, which picks after the graph
            fast = (
                t_body
                + f_body
                + [fired_stmt(self.ctx.note(s, "if on a tensor around logs -> logs deferred with the test"), s)]
            )
        elif not speculate:
            fast = fns + use_cond
        else:
            fallback = (
                ast.If(rt_call("cond_ok", name_node(p), copy.deepcopy(tt), copy.deepcopy(ff)), fns + use_cond, select)
                if not logs
                else select[0]
            )
            where = self.ctx.note(s, ("early return " if early else "") + "if on a tensor -> torch.where")
            fast = (
                t_body
                + f_body
                + [
                    ast.If(
                        rt_call("mergeable", name_node(p), tt, ff),
                        [
                            fired_stmt(where, s),
                            assign(rt_call("merge", name_node(p), copy.deepcopy(tt), copy.deepcopy(ff))),
                        ],
                        [fallback],
                    )
                ]
            )
        original = ast.If(
            name_node(p), self.stmts(copy.deepcopy(T), set(defined)), self.stmts(copy.deepcopy(F), set(defined))
        )
        new = [ast.Assign([name_node(p, True)], exact_items(s.test)), ast.If(guard_test(p, pure), fast, [original])]
        return located(new, s)

    def nested_ok(self, s: ast.If, pure: Purity, bound: set[str]) -> bool:
        """Whether an ``if`` inside a branch can be lowered (``lower``): a tensor test, branches that only
        assign side-effect-free values to names (or hold such ifs), nothing that draws random numbers or
        can raise on some data (both nested branches will run), and every name bound on one side only
        already bound before (the other side keeps its value). Adds the ``self.<module>`` calls to check
        at run time to ``pure``."""
        if not maybe_tensor_test(s.test, self.ctx):
            return False
        inner = purity(exact_items(s.test), self.ctx, Purity())
        if not all(self.straight_body(branch, inner, bound) for branch in (s.body, s.orelse)):
            return False
        if not inner.ok or inner.random or inner.may_fail:
            return False
        if (names_stored(s.body) ^ names_stored(s.orelse)) - bound:
            return False
        pure.modules += inner.modules
        return True

    def straight_body(self, body: list[ast.stmt], pure: Purity, bound: set[str]) -> bool:
        """Whether ``body`` only assigns to plain names (``pure`` collects what the values read) and holds
        ifs that :meth:`nested_ok` lowers; ``bound`` (the names bound before it) is not changed."""
        bound = set(bound)
        for st in body:
            if isinstance(st, ast.Pass):
                continue
            if isinstance(st, ast.Assign) and len(st.targets) == 1 and plain_target(st.targets[0]):
                purity(st.value, self.ctx, pure)
            elif not (isinstance(st, ast.If) and self.nested_ok(st, pure, bound)):
                return False
            bound |= names_stored([st])
        return True

    def lower(self, s: ast.If) -> list[ast.stmt]:
        """A nested tensor if (``nested_ok``) as plain assignments: the test, both branches under fresh
        names, then ``x, y = _mend_rt.pick(test, (xt, yt), (xf, yf))`` (a select in the graph)."""
        outputs = sorted(names_stored(s.body) | names_stored(s.orelse))
        q = self.ctx.fresh("q")
        k = self.ctx.counter
        t_body, t_outs = self.branch(s.body, f"_mend_nt{k}_", outputs, (q, 1))
        f_body, f_outs = self.branch(s.orelse, f"_mend_nf{k}_", outputs, (q, -1))
        note = self.ctx.note(s, "nested if on a tensor -> torch.where")
        pick = rt_call(
            "pick",
            ast.Constant(note),
            name_node(q),
            ast.Tuple([name_node(x) for x in t_outs], ast.Load()),
            ast.Tuple([name_node(x) for x in f_outs], ast.Load()),
        )
        new = [
            ast.Assign([name_node(q, True)], exact_items(s.test)),
            *t_body,
            *f_body,
            ast.Assign([ast.Tuple([name_node(x, True) for x in outputs], ast.Store())], pick),
        ]
        return located(new, s)
