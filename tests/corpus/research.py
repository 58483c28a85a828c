"""Corpus programs in the style of public research code (ParityBench-like modules), by category.

The patterns are the ones real ``nn.Module``s break on (issue 14): legacy autograd, tensor tests the
branch rules did not reach (conditional expressions, ``and``/``or``, comprehensions, a ``for`` over
layers with ``if <tensor>: break``, a ``while`` mixing a tensor and a counter), data-dependent integers,
objects Dynamo cannot trace, and everyday modules (attention, residual blocks, losses, norms) with the
debugging prints, asserts and shape checks research code carries. Each program states the graph and
break counts it gives after mending; ``note`` says why a break remains.
"""

# written the way research code is written (a tensor default argument, a bare warnings.warn): capturing that
# is what the corpus tests, so these two rules do not apply here (as for programs.py in pyproject.toml)
# ruff: noqa: B008, B028

from __future__ import annotations

import logging
import math
import warnings
from collections import OrderedDict, namedtuple
from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from programs import Program
from torch.autograd import Variable

log = logging.getLogger("torchmux.corpus")


def img(batch: int = 2, channels: int = 4, size: int = 8) -> torch.Tensor:
    return torch.randn(batch, channels, size, size)


def seq(batch: int = 2, length: int = 6, dim: int = 16) -> torch.Tensor:
    return torch.randn(batch, length, dim)


def frozen(model: nn.Module) -> nn.Module:
    """Inference-style: parameters need no gradient (``for p in model.parameters(): p.requires_grad = False``)."""
    for p in model.parameters():
        p.requires_grad_(False)
    return model


# --- legacy autograd ---------------------------------------------------------------------------------


class LegacyGRUEncoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.gru = nn.GRU(16, 16, batch_first=True)

    def forward(self, x):
        h0 = Variable(torch.zeros(1, x.size(0), 16))
        out, h = self.gru(x, h0)
        return out[:, -1] + h[0]


class LegacyMaskNoGrad(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 16)

    def forward(self, x):
        mask = Variable(torch.ones(x.size(0), 16), requires_grad=False)
        mask[:, ::2] = 0
        return self.fc(x) * mask


class LegacyDataNormalize(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(16, 16))

    def forward(self, x):
        w = self.weight.data
        w = w / w.norm(dim=1, keepdim=True)
        return F.linear(x, w)


class LegacyWrapInput(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 8)

    def forward(self, x):
        x = Variable(x.data)
        return torch.sigmoid(self.fc(x))


class LegacyNewZeros(nn.Module):
    def forward(self, x):
        pad = Variable(x.data.new(x.size(0), 4).zero_(), requires_grad=False)
        return torch.cat([x, pad], dim=1)


class LegacyRequiresGradFlag(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 16)

    def forward(self, x):
        target = self.fc(x).detach()
        target.requires_grad_(False)
        return F.mse_loss(self.fc(x), target)


class LegacyVariableNeedsGrad(nn.Module):
    def forward(self, x):
        noise = Variable(torch.zeros_like(x), requires_grad=True)
        return (x + noise).sum(dim=1)


class LegacyDataClamp(nn.Module):
    def forward(self, x):
        y = x.clone()
        y.data.clamp_(-1, 1)
        return y * 2


class LegacyTypeAs(nn.Module):
    def forward(self, x):
        idx = Variable(torch.arange(x.size(1))).type_as(x)
        return x * idx


class LegacyVariableLoop(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.cell = nn.GRUCell(16, 16)

    def forward(self, x):
        h = Variable(torch.zeros(x.size(0), 16), requires_grad=False)
        for t in range(x.size(1)):
            h = self.cell(x[:, t], h)
        return h


class LegacyResizedState(nn.Module):
    """Pre-0.4 GRU code: the zero state as ``x.data.new().resize_(...).fill_(0)``, a mask as
    ``new().resize_as_(...)``, and the size given as separate integers once."""

    def __init__(self) -> None:
        super().__init__()
        self.cell = nn.GRUCell(16, 8)

    def forward(self, x):
        hx = Variable(x.data.new().resize_((x.size(0), 8)).fill_(0))
        keep = x.data.new().resize_as_(x.data).fill_(1)
        keep[:, 0] = 0
        bias = x.new().resize_(x.size(0), 8).zero_()
        for t in range(x.size(1)):
            hx = self.cell(x[:, t] * keep[:, t], hx) + bias
        return hx


# --- tensor tests in expressions, and/or, comprehensions -----------------------------------------------


def ifexp_scale(x):
    y = x * 0.5 if x.abs().mean() > 1 else x * 2
    return y.tanh()


def ifexp_in_return(x):
    return x.relu() if x.sum() > 0 else x.sigmoid()


def ifexp_nested(x):
    s = x.mean()
    y = x * 3 if s > 0.5 else (x * 2 if s > 0 else x)
    return y


class IfexpModule(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 16)

    def forward(self, x):
        h = self.fc(x)
        h = h / h.norm() if h.norm() > 10 else h
        return h


def ifexp_python_flag(x, flag=True):
    return x + 1 if flag else x - 1


def and_test(x):
    if x.mean() > 0 and x.std() < 2:
        x = x - x.mean()
    return x


def or_test(x):
    if torch.isnan(x).any() or torch.isinf(x).any():
        x = torch.nan_to_num(x)
    return x * 2


def optional_mask_and(x, mask=torch.ones(4, 16)):
    if mask is not None and mask.sum() > 0:
        x = x * mask
    return x


def not_and_test(x):
    if not (x.max() > 3 and x.min() < -3):
        x = x.clamp(-2, 2)
    return x


def comprehension_ifexp(x):
    rows = [r / r.norm() if r.norm() > 1 else r for r in x]
    return torch.stack(rows)


def comprehension_sum(x):
    parts = [x[:, i : i + 4].sum(dim=1) for i in range(0, 16, 4)]
    return torch.stack(parts, dim=1)


class MultiHeadMerge(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.heads = nn.ModuleList([nn.Linear(16, 4) for _ in range(4)])

    def forward(self, x):
        outs = [h(x) for h in self.heads]
        return torch.cat([o if o.mean() > -10 else o * 0 for o in outs], dim=-1)


def while_mixed_counter(x):
    i = 0
    while x.norm() > 1 and i < 10:
        x = x / 2
        i += 1
    return x


def and_assert(x):
    assert x.dim() == 2 and x.shape[1] == 16
    return x.softmax(-1)


# --- a for over layers with `if <tensor>: break` -------------------------------------------------------


class EarlyExitStack(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList([nn.Sequential(nn.Linear(16, 16), nn.Tanh()) for _ in range(4)])

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
            if x.abs().mean() < 0.05:
                break
        return x


class EarlyExitResidual(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([nn.Linear(16, 16) for _ in range(3)])

    def forward(self, x):
        for block in self.blocks:
            delta = block(x).relu()
            x = x + delta
            if delta.norm() < 1e-3 * x.norm():
                break
        return x


class EarlyExitSequential(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU())

    def forward(self, x):
        for m in self.body:
            x = m(x)
            if x.max() > 50:
                break
        return x


class UserBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 16)
        self.calls = 0

    def forward(self, x):
        return self.fc(x).relu()


class EarlyExitUserBlocks(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([UserBlock() for _ in range(3)])

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
            if x.sum() < 0:
                break
        return x


class ConvergeLoop(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.step = nn.Linear(16, 16)

    def forward(self, x):
        z = torch.zeros_like(x)
        for _ in range(5):
            z_new = torch.tanh(self.step(z) + x)
            if (z_new - z).abs().max() < 1e-4:
                break
            z = z_new
        return z


# --- data-dependent integers -------------------------------------------------------------------------


def int_item_as_size(x):
    n = int(x.abs().sum().item()) % 3 + 1
    return torch.zeros(n, 16) + x.mean()


def tolist_as_sizes(x, shape=torch.tensor([8, 8])):
    rows, cols = shape.tolist()
    return x.reshape(-1)[: rows * cols].reshape(rows, cols)


def range_of_item(x, steps=torch.tensor(3)):
    for _ in range(steps.item()):
        x = x * 0.9 + 0.1
    return x


def narrow_by_length(x, lengths=torch.tensor([3, 5, 2, 4])):
    k = int(lengths.max())
    return x[:, :k].sum(dim=1)


def arange_of_max(x, counts=torch.tensor([1, 2, 3])):
    n = counts.sum().item()
    return torch.arange(n).float().mean() + x


def topk_of_item(x, k=torch.tensor(3)):
    return x.topk(int(k.item()), dim=-1).values


def float_item_scale(x):
    scale = x.abs().max().item()
    return x / scale


def item_in_helper_test(x):
    def is_positive(v):
        return v.mean().item() > 0.0

    if is_positive(x):
        return x + 1
    return x - 1


def split_by_tolist(x, sizes=torch.tensor([6, 10])):
    a, b = torch.split(x, sizes.tolist(), dim=1)
    return a.sum(dim=1) - b.sum(dim=1)


def repeat_by_item(x, times=torch.tensor(2)):
    return x.repeat(int(times), 1)


def nonzero_gather(x):
    idx = (x[:, 0] > 0).nonzero().squeeze(1)
    return x.index_select(0, idx).sum()


def masked_mean(x):
    valid = x[x.abs() < 1]
    return valid.mean() if valid.numel() > 0 else x.mean()


# --- objects Dynamo cannot trace -----------------------------------------------------------------------


class DottedConfig:
    """An ``EasyDict``-like configuration object: attributes looked up in a dict."""

    def __init__(self, **values) -> None:
        self._values = values

    def __getattr__(self, name):
        try:
            return self.__dict__["_values"][name]
        except KeyError:
            raise AttributeError(name) from None


class AttrDict(dict):
    __getattr__ = dict.__getitem__
    __setattr__ = dict.__setitem__


class OrderedConfig(OrderedDict):
    pass


@dataclass
class DataclassConfig:
    hidden: int = 16
    scale: float = 0.5


Hyper = namedtuple("Hyper", ["scale", "shift"])


class ConfiguredMLP(nn.Module):
    def __init__(self, cfg) -> None:
        super().__init__()
        self.cfg = cfg
        self.fc = nn.Linear(16, 16)

    def forward(self, x):
        return self.fc(x) * self.cfg.scale


class DictConfigMLP(nn.Module):
    def __init__(self, cfg) -> None:
        super().__init__()
        self.cfg = cfg
        self.fc = nn.Linear(16, 16)

    def forward(self, x):
        return self.fc(x) * self.cfg["scale"]


class HyperModule(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.h = Hyper(0.5, 1.0)

    def forward(self, x):
        return x * self.h.scale + self.h.shift


# --- everyday research modules (ParityBench-style) ----------------------------------------------------


class SEBlock(nn.Module):
    def __init__(self, c: int = 4, r: int = 2) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(c, c // r), nn.Linear(c // r, c)

    def forward(self, x):
        b, c, _, _ = x.size()
        y = F.adaptive_avg_pool2d(x, 1).view(b, c)
        y = torch.sigmoid(self.fc2(F.relu(self.fc1(y)))).view(b, c, 1, 1)
        return x * y.expand_as(x)


class ConvBNReLU(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(4, 8, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(8)

    def forward(self, x):
        return F.relu(self.bn(self.conv(x)), inplace=True)


class ResidualBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.c1, self.c2 = nn.Conv2d(4, 4, 3, padding=1), nn.Conv2d(4, 4, 3, padding=1)

    def forward(self, x):
        out = F.relu(self.c1(x))
        out = self.c2(out)
        return F.relu(out + x)


class ScaledDotAttention(nn.Module):
    def __init__(self, dim: int = 16) -> None:
        super().__init__()
        self.q, self.k, self.v = nn.Linear(dim, dim), nn.Linear(dim, dim), nn.Linear(dim, dim)
        self.scale = 1.0 / math.sqrt(dim)

    def forward(self, x, mask=None):
        q, k, v = self.q(x), self.k(x), self.v(x)
        att = torch.bmm(q, k.transpose(1, 2)) * self.scale
        if mask is not None:
            att = att.masked_fill(mask == 0, -1e9)
        return torch.bmm(F.softmax(att, dim=-1), v)


class MultiHeadSelfAttention(nn.Module):
    def __init__(self, dim: int = 16, heads: int = 4) -> None:
        super().__init__()
        self.heads, self.d = heads, dim // heads
        self.qkv = nn.Linear(dim, dim * 3)
        self.out = nn.Linear(dim, dim)

    def forward(self, x):
        b, n, c = x.shape
        qkv = self.qkv(x).reshape(b, n, 3, self.heads, self.d).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        att = (q @ k.transpose(-2, -1)) / np.sqrt(self.d)
        att = att.softmax(dim=-1)
        return self.out((att @ v).transpose(1, 2).reshape(b, n, c))


class PositionalEncoding(nn.Module):
    def __init__(self, dim: int = 16, max_len: int = 32) -> None:
        super().__init__()
        pe = torch.zeros(max_len, dim)
        pos = torch.arange(0, max_len).unsqueeze(1).float()
        div = torch.exp(torch.arange(0, dim, 2).float() * (-math.log(10000.0) / dim))
        pe[:, 0::2], pe[:, 1::2] = torch.sin(pos * div), torch.cos(pos * div)
        self.register_buffer("pe", pe.unsqueeze(0))

    def forward(self, x):
        return x + self.pe[:, : x.size(1)]


class FocalLoss(nn.Module):
    def __init__(self, gamma: float = 2.0) -> None:
        super().__init__()
        self.gamma = gamma

    def forward(self, logits, target):
        logp = F.log_softmax(logits, dim=-1)
        p = logp.exp()
        loss = -((1 - p) ** self.gamma) * logp
        return loss.gather(1, target.unsqueeze(1)).mean()


class DiceLoss(nn.Module):
    def forward(self, pred, target, smooth=1.0):
        pred = torch.sigmoid(pred).view(-1)
        target = target.view(-1)
        inter = (pred * target).sum()
        return 1 - (2.0 * inter + smooth) / (pred.sum() + target.sum() + smooth)


class LabelSmoothing(nn.Module):
    def __init__(self, eps: float = 0.1) -> None:
        super().__init__()
        self.eps = eps

    def forward(self, logits, target):
        n = logits.size(-1)
        logp = F.log_softmax(logits, dim=-1)
        smooth = -logp.mean(dim=-1)
        nll = -logp.gather(-1, target.unsqueeze(-1)).squeeze(-1)
        return ((1 - self.eps) * nll + self.eps * smooth).mean() * n / n


class LayerNormCustom(nn.Module):
    def __init__(self, dim: int = 16, eps: float = 1e-6) -> None:
        super().__init__()
        self.a, self.b, self.eps = nn.Parameter(torch.ones(dim)), nn.Parameter(torch.zeros(dim)), eps

    def forward(self, x):
        mean = x.mean(-1, keepdim=True)
        std = x.std(-1, keepdim=True)
        return self.a * (x - mean) / (std + self.eps) + self.b


class GELUTanh(nn.Module):
    def forward(self, x):
        return 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * torch.pow(x, 3))))


class Swish(nn.Module):
    def forward(self, x):
        return x * torch.sigmoid(x)


class Mish(nn.Module):
    def forward(self, x):
        return x * torch.tanh(F.softplus(x))


class ChannelShuffle(nn.Module):
    def __init__(self, groups: int = 2) -> None:
        super().__init__()
        self.groups = groups

    def forward(self, x):
        b, c, h, w = x.size()
        x = x.view(b, self.groups, c // self.groups, h, w).transpose(1, 2).contiguous()
        return x.view(b, -1, h, w)


class DepthwiseSeparable(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.dw = nn.Conv2d(4, 4, 3, padding=1, groups=4)
        self.pw = nn.Conv2d(4, 8, 1)

    def forward(self, x):
        return self.pw(F.relu6(self.dw(x)))


class PixelShuffleUp(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(4, 16, 3, padding=1)
        self.ps = nn.PixelShuffle(2)

    def forward(self, x):
        return self.ps(self.conv(x))


class UNetDown(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Sequential(nn.Conv2d(4, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1), nn.ReLU())

    def forward(self, x):
        skip = self.conv(x)
        return F.max_pool2d(skip, 2), skip


class UNetUp(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = nn.ConvTranspose2d(8, 4, 2, stride=2)
        self.conv = nn.Conv2d(8, 4, 3, padding=1)

    def forward(self, x, skip):
        x = self.up(x)
        dy, dx = skip.size(2) - x.size(2), skip.size(3) - x.size(3)
        x = F.pad(x, [dx // 2, dx - dx // 2, dy // 2, dy - dy // 2])
        return F.relu(self.conv(torch.cat([skip, x], dim=1)))


class GramMatrix(nn.Module):
    def forward(self, x):
        b, c, h, w = x.size()
        f = x.view(b, c, h * w)
        return f.bmm(f.transpose(1, 2)) / (c * h * w)


class TotalVariation(nn.Module):
    def forward(self, x):
        dh = (x[:, :, 1:, :] - x[:, :, :-1, :]).abs().sum()
        dw = (x[:, :, :, 1:] - x[:, :, :, :-1]).abs().sum()
        return dh + dw


class AdaIN(nn.Module):
    def forward(self, content, style, eps=1e-5):
        cm, cs = content.mean((2, 3), keepdim=True), content.std((2, 3), keepdim=True) + eps
        sm, ss = style.mean((2, 3), keepdim=True), style.std((2, 3), keepdim=True) + eps
        return ss * (content - cm) / cs + sm


class Highway(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.h, self.t = nn.Linear(16, 16), nn.Linear(16, 16)

    def forward(self, x):
        t = torch.sigmoid(self.t(x))
        return t * F.relu(self.h(x)) + (1 - t) * x


class GatedConv(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(4, 8, 3, padding=1)

    def forward(self, x):
        a, b = self.conv(x).chunk(2, dim=1)
        return a * torch.sigmoid(b)


class PatchEmbed(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Conv2d(4, 16, 4, stride=4)

    def forward(self, x):
        return self.proj(x).flatten(2).transpose(1, 2)


class VAEHead(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.mu, self.logvar = nn.Linear(16, 8), nn.Linear(16, 8)

    def forward(self, x):
        mu, logvar = self.mu(x), self.logvar(x)
        z = mu + torch.randn_like(mu) * torch.exp(0.5 * logvar)
        kld = -0.5 * torch.sum(1 + logvar - mu.pow(2) - logvar.exp())
        return z, kld


def drop_path(x, p: float = 0.0, training: bool = False):
    if p == 0.0 or not training:
        return x
    keep = torch.rand(x.shape[0], 1) > p
    return x * keep / (1 - p)


class DropPathResidual(nn.Module):
    def __init__(self, p: float = 0.2) -> None:
        super().__init__()
        self.fc, self.p = nn.Linear(16, 16), p

    def forward(self, x):
        return x + drop_path(self.fc(x), self.p, self.training)


class TransformerBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(16), nn.LayerNorm(16)
        self.attn = MultiHeadSelfAttention()
        self.mlp = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 16))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class LSTMClassifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(16, 16, batch_first=True)
        self.fc = nn.Linear(16, 3)

    def forward(self, x):
        out, (h, c) = self.lstm(x)
        return self.fc(h[-1])


class EmbeddingBagMean(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(20, 16)

    def forward(self, tokens):
        return self.emb(tokens).mean(dim=1)


class SpectralNormConv(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.utils.spectral_norm(nn.Conv2d(4, 4, 3, padding=1))
        # as after training: power iteration has converged, so sigma is the largest singular value (a fresh
        # u, v make sigma near zero at random, and eval-mode outputs so large that any reordering of the
        # float sums shows)
        with torch.no_grad():
            for _ in range(20):
                self.conv(torch.zeros(1, 4, 8, 8))

    def forward(self, x):
        return F.leaky_relu(self.conv(x), 0.2)


class DebugPrintBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 16)

    def forward(self, x):
        print("input", x.shape)
        y = self.fc(x)
        print(f"mean activation {y.mean().item():.4f}")
        return y


class ShapeAssertBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(4, 4, 1)

    def forward(self, x):
        assert x.dim() == 4, "expected NCHW"
        if x.size(1) != 4:
            raise ValueError(f"expected 4 channels, got {x.size(1)}")
        return self.conv(x)


class NaNGuard(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 16)

    def forward(self, x):
        y = self.fc(x)
        if torch.isnan(y).any():
            raise RuntimeError("NaN in activations")
        return y


class LoggedLoss(nn.Module):
    def forward(self, pred, target):
        loss = F.mse_loss(pred, target)
        log.info("loss %.5f", loss.item())
        return loss


class WarnOnLargeInput(nn.Module):
    def forward(self, x):
        if x.abs().max() > 100:
            warnings.warn("large input")
        return x.clamp(-100, 100)


class ClampGradBranch(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 16)

    def forward(self, x):
        h = self.fc(x)
        if h.norm() > 5:
            h = h * (5 / h.norm())
        return h


class TemperatureSoftmax(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.t = nn.Parameter(torch.tensor(2.0))

    def forward(self, x):
        return F.softmax(x / self.t.clamp(min=0.1), dim=-1)


class GumbelSoftmaxHead(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 5)

    def forward(self, x):
        return F.gumbel_softmax(self.fc(x), tau=0.5, hard=True)


class MaskedMSE(nn.Module):
    def forward(self, pred, target):
        mask = (target != 0).float()
        return ((pred - target) ** 2 * mask).sum() / mask.sum().clamp(min=1)


class InstanceNormStyle(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.InstanceNorm2d(4, affine=True)

    def forward(self, x):
        return self.norm(x) * 0.5


class CBAMSpatial(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(2, 1, 7, padding=3)

    def forward(self, x):
        avg = torch.mean(x, dim=1, keepdim=True)
        mx, _ = torch.max(x, dim=1, keepdim=True)
        return x * torch.sigmoid(self.conv(torch.cat([avg, mx], dim=1)))


class ContrastiveLoss(nn.Module):
    def __init__(self, temperature: float = 0.5) -> None:
        super().__init__()
        self.t = temperature

    def forward(self, a, b):
        a, b = F.normalize(a, dim=1), F.normalize(b, dim=1)
        logits = a @ b.t() / self.t
        labels = torch.arange(a.size(0))
        return F.cross_entropy(logits, labels)


class NumpyConstScale(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.scale = float(np.sqrt(16))

    def forward(self, x):
        return x / self.scale


class KeepTopK(nn.Module):
    def forward(self, x, k=4):
        vals, idx = x.topk(k, dim=-1)
        return torch.zeros_like(x).scatter(-1, idx, vals)


class SinusoidalTime(nn.Module):
    def forward(self, t):
        half = 8
        freqs = torch.exp(-math.log(10000) * torch.arange(half, dtype=torch.float32) / half)
        args = t[:, None].float() * freqs[None]
        return torch.cat([torch.cos(args), torch.sin(args)], dim=-1)


class EarlyReturnOnEmpty(nn.Module):
    def forward(self, x):
        if x.numel() == 0:
            return x
        return x - x.mean()


class ScoreThreshold(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 1)

    def forward(self, x):
        score = torch.sigmoid(self.fc(x)).mean()
        if score > 0.5:
            out = x * score
        else:
            out = x * (1 - score)
        return out


class ItemStatTracker(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 16)

    def forward(self, x):
        y = self.fc(x)
        sparsity = (y <= 0).float().mean().item()
        print("sparsity", sparsity)
        return F.relu(y)


# --- more of the same, from training loops and inference code ----------------------------------------


class OptionalMaskAttention(nn.Module):
    def forward(self, q, k, mask=None):
        att = q @ k.transpose(-2, -1)
        att = att.masked_fill(mask == 0, float("-inf")) if mask is not None else att
        return att.softmax(-1)


def halve_until_small(x):
    while x.abs().max() > 1:
        x = x * 0.5
    return x


def newton_sqrt(x):
    y = x.clone()
    while (y * y - x).abs().max() > 1e-4:
        y = 0.5 * (y + x / y)
    return y


def pick_row_by_argmax(x):
    i = x.sum(1).argmax().item()
    return x[i] * 2


class NormalizeIfNonzero(nn.Module):
    def forward(self, x):
        norm = x.norm()
        if norm > 0:
            x = x / norm
        return x


class StepCounterPrint(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 16)
        self.calls = 0  # the harness starts the captured run from the same count

    def forward(self, x):
        self.calls += 1
        if self.calls % 10 == 1:
            print("step", self.calls, "mean", x.mean().item())
        return self.fc(x)


class DistillationLoss(nn.Module):
    def __init__(self, t: float = 4.0) -> None:
        super().__init__()
        self.t = t

    def forward(self, student, teacher):
        p = F.log_softmax(student / self.t, dim=-1)
        q = F.softmax(teacher / self.t, dim=-1)
        return F.kl_div(p, q, reduction="batchmean") * self.t**2


class MixupEval(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 4)

    def forward(self, x):
        if self.training:
            lam = float(np.random.beta(0.4, 0.4))
            x = lam * x + (1 - lam) * x.flip(0)
        return self.fc(x)


def keep_similar(x):
    sim = F.cosine_similarity(x, x.mean(0, keepdim=True), dim=1)
    return x[sim > 0].sum(0)


def assert_finite(x):
    assert torch.isfinite(x).all(), "non-finite values"
    return x.exp().log1p()


def while_counter_returned(x):
    steps = 0
    while x.norm() > 1 and steps < 10:
        x = x / 2
        steps += 1
    return x, steps


class ClippedResidual(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 16)

    def forward(self, x):
        r = self.fc(x)
        scale = 1.0 if r.abs().max() < 10 else 0.1
        return x + r * scale


def clamp_both_tails(x):
    lo, hi = x.min(), x.max()
    if lo < -2 or hi > 2:
        x = (x - lo) / (hi - lo) * 4 - 2
    return x


# --- second round: the same breaks in other shapes (recurrent models, attribute-dict configs, data tests) --


class BiGRUTagger(nn.Module):
    """Sequence tagging (NER-style): embeddings, a 2-layer bidirectional GRU, a per-token classifier."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(30, 12)
        self.rnn = nn.GRU(12, 10, num_layers=2, bidirectional=True, batch_first=True)
        self.tag = nn.Linear(20, 5)

    def forward(self, tokens):
        out, _ = self.rnn(self.emb(tokens))
        return F.log_softmax(self.tag(out), dim=-1)


class Seq2SeqLSTM(nn.Module):
    """Encoder-decoder: the encoder's final (h, c) start the decoder (teacher forcing)."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.LSTM(16, 24, num_layers=2)
        self.decoder = nn.LSTM(8, 24, num_layers=2)
        self.out = nn.Linear(24, 8)

    def forward(self, src, tgt):
        _, (h, c) = self.encoder(src)
        dec, _ = self.decoder(tgt, (h, c))
        return self.out(dec)


class CharRNN(nn.Module):
    """The classic tutorial language model: init_hidden with legacy Variables, an Elman RNN."""

    def __init__(self) -> None:
        super().__init__()
        self.rnn = nn.RNN(16, 32, num_layers=2, nonlinearity="relu")
        self.decoder = nn.Linear(32, 16)

    def init_hidden(self, bsz):
        weight = next(self.parameters()).data
        return Variable(weight.new(2, bsz, 32).zero_())

    def forward(self, x):
        hidden = self.init_hidden(x.size(1))
        out, hidden = self.rnn(x, hidden)
        return self.decoder(out.view(-1, 32)), hidden


class EasyConfig(dict):
    """``easydict``-style nested configuration, attributes read from the items."""

    __getattr__ = dict.__getitem__
    __setattr__ = dict.__setitem__
    __delattr__ = dict.__delitem__


class OptionalConfig(dict):
    """A config whose missing options read as None."""

    __getattr__ = dict.get


class ConfigHead(nn.Module):
    """A head configured by a nested attribute dict, read through a local alias and a nested key."""

    def __init__(self, opt) -> None:
        super().__init__()
        self.opt = opt
        self.proj = nn.Linear(opt.model.dim, opt.model.dim)
        self.norm = nn.LayerNorm(opt.model.dim)

    def forward(self, x):
        opt = self.opt
        h = self.proj(x) * opt.model.residual_scale
        if opt.model.pre_norm:
            h = self.norm(h)
        return x + F.dropout(h, p=opt.train.dropout, training=self.training)


class OptionalFeatures(nn.Module):
    """Options that may be absent (None): a dict.get attribute dict."""

    def __init__(self, cfg) -> None:
        super().__init__()
        self.cfg = cfg
        self.fc = nn.Linear(16, 16)

    def forward(self, x):
        y = self.fc(x)
        if self.cfg.clip is not None:
            y = y.clamp(-self.cfg.clip, self.cfg.clip)
        return y * (self.cfg.gain or 1.0)


HPARAMS = EasyConfig(temperature=0.1, eps=1e-6)


def nt_xent(z1, z2):
    """A SimCLR-style loss reading a module-level hyper-parameter dict."""
    z1 = F.normalize(z1, dim=1, eps=HPARAMS.eps)
    z2 = F.normalize(z2, dim=1, eps=HPARAMS.eps)
    logits = z1 @ z2.t() / HPARAMS.temperature
    return F.cross_entropy(logits, torch.arange(z1.size(0)))


class ConfidenceGate(nn.Module):
    """Adaptive computation: a refinement runs only when the prediction is not confident enough,
    decided by a helper method comparing a float .item() with a threshold."""

    def __init__(self) -> None:
        super().__init__()
        self.head = nn.Linear(16, 4)
        self.refine = nn.Linear(16, 16)
        self.threshold = 0.5

    def _confident(self, logits):
        return logits.softmax(-1).max().item() > self.threshold

    def forward(self, x):
        logits = self.head(x)
        if not self._confident(logits):
            logits = self.head(torch.tanh(self.refine(x)) + x)
        return logits


def masked_token_loss(logits, labels):
    """MLM-style loss over the masked positions only; zero when nothing was masked."""
    picked = logits[labels >= 0]
    if picked.size(0) == 0:
        return logits.sum() * 0.0
    return F.cross_entropy(picked, labels[labels >= 0])


def positive_fraction(scores):
    """The share of positive scores, guarded against an empty selection (nonzero())."""
    pos = (scores > 0).nonzero()
    frac = pos.shape[0] / scores.numel() if pos.numel() > 0 else 0.0
    return scores * (1 + frac)


def _programs() -> list[Program]:
    P = Program
    lab = lambda: torch.tensor([0, 2, 1, 1])  # noqa: E731 - class labels for the loss programs
    return [
        # legacy autograd
        P(
            "legacy_gru_h0",
            "legacy autograd",
            "Variable(torch.zeros(...)) as the initial hidden state",
            lambda: (LegacyGRUEncoder(), (seq(),)),
        ),
        P(
            "legacy_mask_no_grad",
            "legacy autograd",
            "Variable(..., requires_grad=False) mask",
            lambda: (LegacyMaskNoGrad(), (torch.randn(4, 16),)),
        ),
        P(
            "legacy_data_normalize",
            "legacy autograd",
            "weight.data normalised in forward",
            lambda: (LegacyDataNormalize(), (torch.randn(4, 16),)),
        ),
        P(
            "legacy_wrap_input",
            "legacy autograd",
            "Variable(x.data)",
            lambda: (LegacyWrapInput(), (torch.randn(4, 16),)),
        ),
        P(
            "legacy_new_zeros",
            "legacy autograd",
            "Variable(x.data.new(...).zero_(), requires_grad=False)",
            lambda: (LegacyNewZeros(), (torch.randn(4, 16),)),
        ),
        P(
            "legacy_requires_grad_flag",
            "legacy autograd",
            "requires_grad_(False) on a target in forward",
            lambda: (LegacyRequiresGradFlag(), (torch.randn(4, 16),)),
        ),
        P(
            "legacy_variable_needs_grad",
            "legacy autograd",
            "Variable(..., requires_grad=True) in forward",
            lambda: (LegacyVariableNeedsGrad(), (torch.randn(4, 16),)),
            graphs=2,
            breaks=1,
            note="a new leaf needing gradients cannot leave a graph (Dynamo: requires_grad_() intermediate leaked)",
        ),
        P(
            "legacy_data_clamp",
            "legacy autograd",
            "y.data.clamp_() in forward",
            lambda: (LegacyDataClamp(), (torch.randn(4, 16) * 3,)),
        ),
        P(
            "legacy_type_as",
            "legacy autograd",
            "Variable(torch.arange(...)).type_as(x)",
            lambda: (LegacyTypeAs(), (torch.randn(4, 16),)),
        ),
        P(
            "legacy_variable_loop",
            "legacy autograd",
            "Variable hidden state through a GRUCell loop",
            lambda: (LegacyVariableLoop(), (seq(),)),
        ),
        P(
            "legacy_resized_state",
            "legacy autograd",
            "x.data.new().resize_(...).fill_(0) state, new().resize_as_(x) mask",
            lambda: (LegacyResizedState(), (seq(),)),
        ),
        # tensor tests in expressions, and/or, comprehensions, mixed while
        P("ifexp_scale", "expressions", "a if <tensor test> else b", lambda: (ifexp_scale, (torch.randn(4, 16) * 2,))),
        P(
            "ifexp_in_return",
            "expressions",
            "return a if <tensor test> else b",
            lambda: (ifexp_in_return, (torch.randn(4, 16),)),
        ),
        P(
            "ifexp_nested",
            "expressions",
            "nested conditional expressions",
            lambda: (ifexp_nested, (torch.randn(4, 16) + 0.3,)),
        ),
        P(
            "ifexp_module",
            "expressions",
            "conditional expression on an activation norm (needs grad: torch.cond)",
            lambda: (IfexpModule(), (torch.randn(4, 16) * 3,)),
        ),
        P(
            "ifexp_python_flag",
            "expressions",
            "conditional expression on a Python flag (left to Dynamo)",
            lambda: (ifexp_python_flag, (torch.randn(4, 16),)),
        ),
        P("and_test", "expressions", "if <tensor> and <tensor>", lambda: (and_test, (torch.randn(4, 16) + 0.5,))),
        P(
            "or_test",
            "expressions",
            "if <tensor> or <tensor> (nan/inf guard)",
            lambda: (or_test, (torch.randn(4, 16),)),
        ),
        P(
            "optional_mask_and",
            "expressions",
            "if mask is not None and <tensor>",
            lambda: (optional_mask_and, (torch.randn(4, 16),)),
        ),
        P(
            "not_and_test",
            "expressions",
            "if not (<tensor> and <tensor>)",
            lambda: (not_and_test, (torch.randn(4, 16) * 3,)),
        ),
        P(
            "comprehension_ifexp",
            "expressions",
            "conditional expression in a list comprehension",
            lambda: (comprehension_ifexp, (torch.randn(4, 16) * 0.3,)),
        ),
        P(
            "comprehension_sum",
            "expressions",
            "list comprehension over slices",
            lambda: (comprehension_sum, (torch.randn(4, 16),)),
        ),
        P(
            "multihead_merge",
            "expressions",
            "comprehensions over heads with a tensor test",
            lambda: (frozen(MultiHeadMerge()), (torch.randn(4, 16),)),
        ),
        P(
            "while_mixed_counter",
            "expressions",
            "while <tensor test> and <Python counter>",
            lambda: (while_mixed_counter, (torch.randn(4, 16) * 4,)),
        ),
        P("and_assert", "expressions", "assert on shapes joined by and", lambda: (and_assert, (torch.randn(4, 16),))),
        # a for over layers with `if <tensor>: break`
        P(
            "early_exit_stack",
            "layers with break",
            "for layer in layers: ...; if <tensor>: break",
            lambda: (EarlyExitStack(), (torch.randn(4, 16),)),
        ),
        P(
            "early_exit_stack_frozen",
            "layers with break",
            "the same, inference-style (no gradients)",
            lambda: (frozen(EarlyExitStack()), (torch.randn(4, 16),)),
        ),
        P(
            "early_exit_residual",
            "layers with break",
            "residual blocks with a convergence break",
            lambda: (EarlyExitResidual(), (torch.randn(4, 16),)),
        ),
        P(
            "early_exit_sequential",
            "layers with break",
            "for m in self.body (a Sequential) with a break",
            lambda: (frozen(EarlyExitSequential()), (torch.randn(4, 16) * 10,)),
        ),
        P(
            "early_exit_user_blocks",
            "layers with break",
            "user-defined blocks with a break",
            lambda: (EarlyExitUserBlocks(), (torch.randn(4, 16),)),
        ),
        P(
            "converge_loop",
            "layers with break",
            "fixed-point iteration with a convergence break",
            lambda: (ConvergeLoop(), (torch.randn(4, 16),)),
        ),
        # data-dependent integers
        P(
            "int_item_as_size",
            "data-dependent ints",
            "int(t.item()) as a size",
            lambda: (int_item_as_size, (torch.randn(4, 16),)),
        ),
        P(
            "tolist_as_sizes",
            "data-dependent ints",
            ".tolist() as a shape",
            lambda: (tolist_as_sizes, (torch.randn(4, 16),)),
        ),
        P("range_of_item", "data-dependent ints", "range(t.item())", lambda: (range_of_item, (torch.randn(4, 16),))),
        P(
            "narrow_by_length",
            "data-dependent ints",
            "int(lengths.max()) as a slice end",
            lambda: (narrow_by_length, (torch.randn(4, 16),)),
        ),
        P(
            "arange_of_item",
            "data-dependent ints",
            "torch.arange(n.item())",
            lambda: (arange_of_max, (torch.randn(4, 16),)),
        ),
        P("topk_of_item", "data-dependent ints", "topk(int(k.item()))", lambda: (topk_of_item, (torch.randn(4, 16),))),
        P(
            "float_item_scale",
            "data-dependent ints",
            "x / x.abs().max().item()",
            lambda: (float_item_scale, (torch.randn(4, 16),)),
        ),
        P(
            "item_in_helper_test",
            "data-dependent ints",
            "float .item() compared in a helper, used as a test",
            lambda: (item_in_helper_test, (torch.randn(4, 16),)),
        ),
        P(
            "split_by_tolist",
            "data-dependent ints",
            "torch.split(x, sizes.tolist())",
            lambda: (split_by_tolist, (torch.randn(4, 16),)),
        ),
        P(
            "repeat_by_item",
            "data-dependent ints",
            "x.repeat(int(t), 1)",
            lambda: (repeat_by_item, (torch.randn(4, 16),)),
        ),
        P(
            "nonzero_gather",
            "data-dependent ints",
            "index_select by nonzero()",
            lambda: (nonzero_gather, (torch.randn(4, 16),)),
        ),
        P(
            "masked_mean",
            "data-dependent ints",
            "mean of a boolean-masked selection, numel() test",
            lambda: (masked_mean, (torch.randn(4, 16),)),
        ),
        # objects Dynamo cannot trace
        P(
            "dotted_config",
            "objects",
            "config object with a custom __getattr__",
            lambda: (ConfiguredMLP(DottedConfig(scale=0.5)), (torch.randn(4, 16),)),
        ),
        P(
            "attrdict_config",
            "objects",
            "dict subclass with __getattr__ = dict.__getitem__",
            lambda: (ConfiguredMLP(AttrDict(scale=0.5)), (torch.randn(4, 16),)),
        ),
        P(
            "ordered_config",
            "objects",
            "OrderedDict subclass config read by key",
            lambda: (DictConfigMLP(OrderedConfig(scale=0.5)), (torch.randn(4, 16),)),
        ),
        P(
            "dataclass_config",
            "objects",
            "dataclass config",
            lambda: (ConfiguredMLP(DataclassConfig()), (torch.randn(4, 16),)),
        ),
        P(
            "namespace_config",
            "objects",
            "SimpleNamespace config",
            lambda: (ConfiguredMLP(SimpleNamespace(scale=0.5)), (torch.randn(4, 16),)),
        ),
        P("namedtuple_hyper", "objects", "namedtuple hyper-parameters", lambda: (HyperModule(), (torch.randn(4, 16),))),
        P(
            "dict_config",
            "objects",
            "plain dict config",
            lambda: (DictConfigMLP({"scale": 0.5}), (torch.randn(4, 16),)),
        ),
        # everyday research modules
        P("se_block", "research modules", "squeeze-and-excitation", lambda: (SEBlock(), (img(),))),
        P("conv_bn_relu", "research modules", "conv + batchnorm + relu(inplace)", lambda: (ConvBNReLU(), (img(),))),
        P("residual_block", "research modules", "residual conv block", lambda: (ResidualBlock(), (img(),))),
        P(
            "scaled_dot_attention",
            "research modules",
            "attention with an optional mask",
            lambda: (ScaledDotAttention(), (seq(), torch.ones(2, 6, 6))),
        ),
        P(
            "mhsa",
            "research modules",
            "multi-head self-attention with np.sqrt",
            lambda: (MultiHeadSelfAttention(), (seq(),)),
        ),
        P(
            "positional_encoding",
            "research modules",
            "sinusoidal positional encoding buffer",
            lambda: (PositionalEncoding(), (seq(),)),
        ),
        P("focal_loss", "research modules", "focal loss", lambda: (FocalLoss(), (torch.randn(4, 3), lab()))),
        P("dice_loss", "research modules", "dice loss", lambda: (DiceLoss(), (img(), (img() > 0).float()))),
        P(
            "label_smoothing",
            "research modules",
            "label smoothing loss",
            lambda: (LabelSmoothing(), (torch.randn(4, 3), lab())),
        ),
        P("layernorm_custom", "research modules", "hand-written layer norm", lambda: (LayerNormCustom(), (seq(),))),
        P("gelu_tanh", "research modules", "tanh GELU with math.sqrt", lambda: (GELUTanh(), (torch.randn(4, 16),))),
        P("swish", "research modules", "swish", lambda: (Swish(), (torch.randn(4, 16),))),
        P("mish", "research modules", "mish", lambda: (Mish(), (torch.randn(4, 16),))),
        P("channel_shuffle", "research modules", "ShuffleNet channel shuffle", lambda: (ChannelShuffle(), (img(),))),
        P(
            "depthwise_separable",
            "research modules",
            "MobileNet depthwise-separable conv",
            lambda: (DepthwiseSeparable(), (img(),)),
        ),
        P("pixel_shuffle_up", "research modules", "sub-pixel upsampling", lambda: (PixelShuffleUp(), (img(),))),
        P("unet_down", "research modules", "U-Net down block returning a skip", lambda: (UNetDown(), (img(),))),
        P(
            "unet_up",
            "research modules",
            "U-Net up block with size padding",
            lambda: (UNetUp(), (img(2, 8, 4), img(2, 4, 8))),
        ),
        P("gram_matrix", "research modules", "style Gram matrix", lambda: (GramMatrix(), (img(),))),
        P("total_variation", "research modules", "total variation loss", lambda: (TotalVariation(), (img(),))),
        P("adain", "research modules", "adaptive instance normalisation", lambda: (AdaIN(), (img(), img()))),
        P("highway", "research modules", "highway layer", lambda: (Highway(), (torch.randn(4, 16),))),
        P("gated_conv", "research modules", "GLU-gated conv", lambda: (GatedConv(), (img(),))),
        P("patch_embed", "research modules", "ViT patch embedding", lambda: (PatchEmbed(), (img(),))),
        P("vae_head", "research modules", "VAE reparameterisation + KL", lambda: (VAEHead(), (torch.randn(4, 16),))),
        P(
            "drop_path_eval",
            "research modules",
            "stochastic depth (eval: identity)",
            lambda: (DropPathResidual(), (torch.randn(4, 16),)),
        ),
        P(
            "transformer_block",
            "research modules",
            "pre-norm transformer block",
            lambda: (TransformerBlock(), (seq(),)),
        ),
        P(
            "lstm_classifier",
            "research modules",
            "LSTM classifier",
            lambda: (LSTMClassifier(), (seq(),)),
        ),
        P(
            "embedding_mean",
            "research modules",
            "embedding mean pooling",
            lambda: (EmbeddingBagMean(), (torch.randint(0, 20, (4, 5)),)),
        ),
        P(
            "spectral_norm_conv",
            "research modules",
            "spectral-normalised conv (forward pre-hook)",
            lambda: (SpectralNormConv(), (img(),)),
        ),
        P(
            "debug_print_block",
            "research modules",
            "debug prints of a shape and an .item()",
            lambda: (DebugPrintBlock(), (torch.randn(4, 16),)),
        ),
        P("shape_assert_block", "research modules", "assert/raise on shapes", lambda: (ShapeAssertBlock(), (img(),))),
        P("nan_guard", "research modules", "raise on NaN activations", lambda: (NaNGuard(), (torch.randn(4, 16),))),
        P(
            "logged_loss",
            "research modules",
            "logger.info of loss.item()",
            lambda: (LoggedLoss(), (torch.randn(4, 16), torch.randn(4, 16))),
        ),
        P(
            "warn_on_large_input",
            "research modules",
            "warnings.warn under a tensor test",
            lambda: (WarnOnLargeInput(), (torch.randn(4, 16) * 100,)),
        ),
        P(
            "clamp_grad_branch",
            "research modules",
            "norm clipping under a tensor if (needs grad: torch.cond)",
            lambda: (ClampGradBranch(), (torch.randn(4, 16) * 3,)),
        ),
        P(
            "temperature_softmax",
            "research modules",
            "learned temperature softmax",
            lambda: (TemperatureSoftmax(), (torch.randn(4, 16),)),
        ),
        P(
            "gumbel_softmax_head",
            "research modules",
            "hard Gumbel-softmax (random)",
            lambda: (GumbelSoftmaxHead(), (torch.randn(4, 16),)),
        ),
        P(
            "masked_mse",
            "research modules",
            "masked MSE",
            lambda: (MaskedMSE(), (torch.randn(4, 16), torch.randn(4, 16).relu())),
        ),
        P("instance_norm_style", "research modules", "affine instance norm", lambda: (InstanceNormStyle(), (img(),))),
        P("cbam_spatial", "research modules", "CBAM spatial attention", lambda: (CBAMSpatial(), (img(),))),
        P(
            "contrastive_loss",
            "research modules",
            "InfoNCE loss",
            lambda: (ContrastiveLoss(), (torch.randn(4, 16), torch.randn(4, 16))),
        ),
        P(
            "numpy_const_scale",
            "research modules",
            "np.sqrt constant from __init__",
            lambda: (NumpyConstScale(), (torch.randn(4, 16),)),
        ),
        P("keep_topk", "research modules", "keep top-k with scatter", lambda: (KeepTopK(), (torch.randn(4, 16),))),
        P(
            "sinusoidal_time",
            "research modules",
            "diffusion timestep embedding",
            lambda: (SinusoidalTime(), (torch.tensor([1, 5, 10, 50]),)),
        ),
        P(
            "early_return_on_empty",
            "research modules",
            "early return on numel() == 0",
            lambda: (EarlyReturnOnEmpty(), (torch.randn(4, 16),)),
        ),
        P(
            "score_threshold",
            "research modules",
            "if/else on a learned score (needs grad: torch.cond)",
            lambda: (ScoreThreshold(), (torch.randn(4, 16),)),
        ),
        P(
            "item_stat_tracker",
            "research modules",
            ".item() statistic printed",
            lambda: (ItemStatTracker(), (torch.randn(4, 16),)),
        ),
        # more of the same
        P(
            "optional_mask_attention",
            "research modules",
            "masked_fill ... if mask is not None else ...",
            lambda: (OptionalMaskAttention(), (seq(), seq(), torch.ones(2, 6, 6))),
        ),
        P(
            "halve_until_small",
            "loops",
            "while <tensor test>: x = x * 0.5",
            lambda: (halve_until_small, (torch.randn(4, 16) * 9,)),
        ),
        P(
            "newton_sqrt",
            "loops",
            "Newton iteration until a tolerance",
            lambda: (newton_sqrt, (torch.rand(4, 16) + 0.5,)),
        ),
        P(
            "pick_row_by_argmax",
            "data-dependent ints",
            "x[t.argmax().item()]",
            lambda: (pick_row_by_argmax, (torch.randn(4, 16),)),
        ),
        P(
            "normalize_if_nonzero",
            "branches",
            "if norm > 0: x = x / norm",
            lambda: (NormalizeIfNonzero(), (torch.randn(4, 16),)),
        ),
        P(
            "step_counter_print",
            "effects",
            "print every N steps on a Python counter",
            lambda: (StepCounterPrint(), (torch.randn(4, 16),)),
        ),
        P(
            "distillation_loss",
            "research modules",
            "knowledge distillation KL loss",
            lambda: (DistillationLoss(), (torch.randn(4, 8), torch.randn(4, 8))),
        ),
        P(
            "mixup_eval",
            "research modules",
            "NumPy mixup only in training (eval here)",
            lambda: (MixupEval(), (torch.randn(4, 16),)),
        ),
        P(
            "keep_similar",
            "dynamic shapes",
            "boolean mask from cosine similarity",
            lambda: (keep_similar, (torch.randn(4, 16),)),
        ),
        P("assert_finite", "checks", "assert torch.isfinite(x).all()", lambda: (assert_finite, (torch.randn(4, 16),))),
        P(
            "clipped_residual",
            "expressions",
            "1.0 if <tensor test> else 0.1 (Python numbers)",
            lambda: (ClippedResidual(), (torch.randn(4, 16),)),
            graphs=2,
            breaks=1,
            note="both sides are Python floats: which one is data, so Python must decide (torch.where needs tensors)",
        ),
        P(
            "while_counter_returned",
            "expressions",
            "while <tensor> and <counter>, the counter returned",
            lambda: (while_counter_returned, (torch.ones(4, 16) * 2,)),
            graphs=1,
            breaks=2,
            note="an int read after the loop would leave the graph as an unbacked int: the loop runs as written",
        ),
        P(
            "clamp_both_tails",
            "expressions",
            "if <tensor> or <tensor>: rescale",
            lambda: (clamp_both_tails, (torch.randn(4, 16) * 3,)),
        ),
        P(
            "bigru_tagger",
            "research modules",
            "embedding + 2-layer bidirectional GRU tagger",
            lambda: (BiGRUTagger(), (torch.randint(0, 30, (2, 7)),)),
        ),
        P(
            "seq2seq_lstm",
            "research modules",
            "LSTM encoder (h, c) starting an LSTM decoder",
            lambda: (Seq2SeqLSTM(), (torch.randn(5, 2, 16), torch.randn(4, 2, 8))),
        ),
        P(
            "char_rnn_init_hidden",
            "legacy autograd",
            "init_hidden with Variable(weight.new(...).zero_()) into nn.RNN",
            lambda: (CharRNN(), (torch.randn(6, 3, 16),)),
        ),
        P(
            "easydict_nested_config",
            "objects",
            "nested attribute-dict config read through a local alias",
            lambda: (
                ConfigHead(
                    EasyConfig(
                        model=EasyConfig(dim=16, residual_scale=0.5, pre_norm=True),
                        train=EasyConfig(dropout=0.1),
                    )
                ),
                (torch.randn(4, 16),),
            ),
        ),
        P(
            "optional_config_get",
            "objects",
            "attribute dict with __getattr__ = dict.get (missing reads None)",
            lambda: (OptionalFeatures(OptionalConfig(clip=0.5)), (torch.randn(4, 16) * 3,)),
        ),
        P(
            "global_hparams_loss",
            "objects",
            "module-level attribute-dict hyper-parameters in a loss",
            lambda: (nt_xent, (torch.randn(4, 16), torch.randn(4, 16))),
        ),
        P(
            "confidence_gate",
            "data-dependent ints",
            "not self._confident(x) (float .item() > threshold in a helper method)",
            lambda: (ConfidenceGate(), (torch.randn(4, 16),)),
        ),
        P(
            "masked_token_loss",
            "data-dependent ints",
            "early return when a masked selection has size(0) == 0",
            lambda: (masked_token_loss, (torch.randn(6, 5), torch.tensor([-1, 2, -1, 0, -1, 4]))),
            graphs=2,
            breaks=1,
            note="cross_entropy may raise on its labels, so only torch.cond may take the branch, and torch.cond "
            "refuses a closure of data-dependent size (torch 2.13: 'could not guard on Eq(5*u0, 0)')",
        ),
        P(
            "positive_fraction",
            "data-dependent ints",
            "nonzero() shape[0] / numel() if numel() > 0 else 0.0",
            lambda: (positive_fraction, (torch.randn(4, 16),)),
            graphs=2,
            breaks=1,
            note="a division (may raise) on one side and a Python float on the other: only Python can choose",
        ),
    ]


RESEARCH: list[Program] = _programs()
