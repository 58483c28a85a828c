"""The model zoo: real models built from code with random weights, no downloads.

Used by the demo, the benchmark and the tests. Hugging Face models come from tiny configs
(``transformers`` must be installed: the ``[dev]`` extra brings it). Every entry returns the model in
eval mode and example inputs for a batch size.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass(frozen=True)
class ZooModel:
    name: str
    build: Callable[[int], tuple[nn.Module, tuple[Any, ...]]]  # batch size -> (model, args)
    needs: str | None = None  # a package it needs, e.g. "transformers"
    description: str = ""


class MLP(nn.Module):
    def __init__(self, d: int = 256, hidden: int = 1024, layers: int = 3) -> None:
        super().__init__()
        dims = [d] + [hidden] * (layers - 1) + [d]
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(dims, dims[1:]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if i < len(self.layers) - 1:
                x = F.gelu(x)
        return x


class Block(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.skip = (
            nn.Sequential()
            if stride == 1 and cin == cout
            else nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(y)) + self.skip(x))


class SmallResNet(nn.Module):
    """A ResNet-style CNN with batch norm: stem, three residual stages, pooling, classifier."""

    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU())
        self.stages = nn.Sequential(Block(16, 16, 1), Block(16, 32, 2), Block(32, 64, 2))
        self.head = nn.Linear(64, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stages(self.stem(x))
        return self.head(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


class AttentionBlock(nn.Module):
    """Pre-norm multi-head self-attention plus MLP, written out (no fused SDPA kernel)."""

    def __init__(self, d: int = 256, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        att = torch.softmax(q @ k.transpose(-1, -2) / (d // self.heads) ** 0.5, dim=-1)
        x = x + self.proj((att @ v).transpose(1, 2).reshape(b, t, d))
        return x + self.fc2(F.gelu(self.fc1(self.norm2(x))))


class RMSNorm(nn.Module):
    def __init__(self, d: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(d)), eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class RMSNormMLP(nn.Module):
    """A Llama-style block: RMS norm, SwiGLU MLP, residual."""

    def __init__(self, d: int = 256, hidden: int = 688) -> None:
        super().__init__()
        self.norm = RMSNorm(d)
        self.gate, self.up, self.down = (
            nn.Linear(d, hidden, bias=False),
            nn.Linear(d, hidden, bias=False),
            nn.Linear(hidden, d, bias=False),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class PointwiseChain(nn.Module):
    """Ten pointwise ops with broadcasting: memory-bound, where fusion pays most."""

    def __init__(self, d: int = 1024) -> None:
        super().__init__()
        self.scale, self.shift = nn.Parameter(torch.randn(d)), nn.Parameter(torch.randn(d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x * self.scale + self.shift
        y = torch.sigmoid(y) * y
        y = torch.tanh(y) + 0.5 * y
        y = torch.exp(-y.abs()) * y - 0.1
        return torch.relu(y) + x


def _hf(kind: str) -> Callable[[int], tuple[nn.Module, tuple[Any, ...]]]:
    def build(batch: int) -> tuple[nn.Module, tuple[Any, ...]]:
        import transformers as tf

        torch.manual_seed(0)
        seq = 32
        common: dict[str, Any] = dict(attn_implementation="eager")
        cfg: Any
        model: nn.Module
        if kind == "bert":
            cfg = tf.BertConfig(
                vocab_size=1000,
                hidden_size=128,
                num_hidden_layers=2,
                num_attention_heads=4,
                intermediate_size=512,
                max_position_embeddings=128,
                **common,
            )
            model = tf.BertModel(cfg)
        elif kind == "gpt2":
            cfg = tf.GPT2Config(
                vocab_size=1000,
                n_embd=128,
                n_layer=2,
                n_head=4,
                n_positions=128,
                bos_token_id=999,
                eos_token_id=999,
                **common,
            )
            model = tf.GPT2LMHeadModel(cfg)
        elif kind == "t5":
            cfg = tf.T5Config(vocab_size=1000, d_model=128, d_kv=32, d_ff=512, num_layers=2, num_heads=4, **common)
            model = tf.T5EncoderModel(cfg)
        elif kind == "vit":
            cfg = tf.ViTConfig(
                image_size=32,
                patch_size=8,
                hidden_size=128,
                num_hidden_layers=2,
                num_attention_heads=4,
                intermediate_size=512,
                **common,
            )
            model = tf.ViTModel(cfg)
            return model.eval(), (torch.randn(batch, 3, 32, 32),)
        else:
            raise ValueError(kind)
        ids = torch.randint(0, 1000, (batch, seq))
        return model.eval(), (ids,)

    return build


def _plain(
    cls: Callable[[], nn.Module], shape: Callable[[int], tuple[int, ...]]
) -> Callable[[int], tuple[nn.Module, tuple[Any, ...]]]:
    def build(batch: int) -> tuple[nn.Module, tuple[Any, ...]]:
        torch.manual_seed(0)
        model = cls().eval()
        if isinstance(model, SmallResNet):  # give batch norm non-trivial statistics
            for m in model.modules():
                if isinstance(m, nn.BatchNorm2d) and m.running_mean is not None and m.running_var is not None:
                    m.running_mean.uniform_(-0.5, 0.5)
                    m.running_var.uniform_(0.5, 1.5)
        return model, (torch.randn(shape(batch)),)

    return build


ZOO: dict[str, ZooModel] = {
    m.name: m
    for m in [
        ZooModel("mlp", _plain(MLP, lambda b: (b, 256)), description="3-layer MLP 256-1024-1024-256, GELU"),
        ZooModel(
            "resnet",
            _plain(SmallResNet, lambda b: (b, 3, 32, 32)),
            description="ResNet-style CNN with batch norm, 32x32",
        ),
        ZooModel(
            "attention",
            _plain(AttentionBlock, lambda b: (b, 64, 256)),
            description="self-attention + MLP block, d=256, t=64",
        ),
        ZooModel("rmsnorm_mlp", _plain(RMSNormMLP, lambda b: (b, 64, 256)), description="RMS norm + SwiGLU MLP block"),
        ZooModel(
            "pointwise", _plain(PointwiseChain, lambda b: (b, 256, 1024)), description="10 pointwise ops, broadcast"
        ),
        ZooModel("bert", _hf("bert"), "transformers", "Hugging Face BERT, tiny config (2 layers, d=128)"),
        ZooModel("gpt2", _hf("gpt2"), "transformers", "Hugging Face GPT-2 LM, tiny config (2 layers, d=128)"),
        ZooModel("t5_encoder", _hf("t5"), "transformers", "Hugging Face T5 encoder, tiny config"),
        ZooModel("vit", _hf("vit"), "transformers", "Hugging Face ViT, tiny config (32x32, patch 8)"),
    ]
}


def build(name: str, batch: int = 1) -> tuple[nn.Module, tuple[Any, ...]]:
    if name not in ZOO:
        raise KeyError(f"unknown model {name!r}; the zoo has {', '.join(ZOO)}")
    return ZOO[name].build(batch)


def tensors_of(out: Any) -> list[torch.Tensor]:
    """The tensors in a model's output (a tensor, a tuple, a dict or a Hugging Face ModelOutput), in order."""
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, dict):
        return [t for v in out.values() for t in tensors_of(v)]
    if isinstance(out, (tuple, list)):
        return [t for v in out for t in tensors_of(v)]
    return []
