"""Which kernel the padding-free forward attends with, and the variable-length one.

``sdpa-padded-grid``: the projections and the FFN run on the real tokens only; attention puts query, key and value
back on the padded grid and runs SDPA under the key (or block-diagonal document) mask. Works everywhere, with
attention dropout.

``varlen``: PyTorch's variable-length flash attention (``torch.nn.attention.varlen.varlen_attn``) on the unpadded
tokens themselves, one segment per row, or per document when rows are packed documents: no compute and no memory
on padding, and no (T, T) mask. CUDA only, and without attention dropout (the kernel has none), so BERT's recipes
(attention dropout 0.1) keep SDPA and the recipes without it (``configs/pretrain/modern_base.yaml``) get it.

The choice is made once per run (``choose``), logged by ``pretrain.train``, and set on the model's attention modules
(``use``); nothing else decides it.
"""
from __future__ import annotations

import functools
import importlib.util
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import nn

SDPA_PADDED_GRID, VARLEN = "sdpa-padded-grid", "varlen"
KERNELS = (SDPA_PADDED_GRID, VARLEN)


@dataclass(frozen=True)
class Unpadding:
    """Where the real tokens of a right-padded ``(batch, length)`` batch lie once laid back to back as ``(N, ...)``.

    Built once per batch (``from_attention_mask``, or ``from_lengths`` for data that was never padded) and passed
    to every module of the padding-free forward. ``cu_seqlens`` and ``max_seqlen`` are the row boundaries that the
    variable-length kernel takes (``segment_starts``: the documents' with ``within_documents``); ``index`` and
    ``key_mask`` place the rows on the padded grid, where the embeddings and SDPA run and dropout draws its masks.
    """

    index: torch.Tensor       # (N,) flat positions of the real tokens in the batch*length grid, row by row
    cu_seqlens: torch.Tensor  # (batch+1,) int32: row b is packed rows cu_seqlens[b]:cu_seqlens[b+1]
    max_seqlen: int
    batch: int
    length: int               # the padded grid's width (>= max_seqlen)
    key_mask: torch.Tensor    # (batch, 1, 1, length) bool, True at real tokens: the padded attention's mask
    document_ids: torch.Tensor | None = None  # (N,): packed documents, each its own attention segment
    # The documents' segments as the loader computed them on the host (``from_loader``), for ``within_documents``.
    document_segments: tuple[torch.Tensor, int] | None = None

    def within_documents(self, document_ids: torch.Tensor) -> Unpadding:
        """This unpadding with its attention segments cut where the unpadded ``document_ids`` (N,) change in a row."""
        return replace(self, document_ids=document_ids)

    @functools.cached_property
    def _segments(self) -> tuple[torch.Tensor, int]:
        if self.document_segments is not None:
            return self.document_segments
        return segments(self.cu_seqlens, self.document_ids)  # computed (one device sync) only by a kernel that asks

    @property
    def segment_starts(self) -> torch.Tensor:
        """(segments+1,) int32 starts of what the padding-free kernel attends within: rows, or their documents."""
        return self.cu_seqlens if self.document_ids is None else self._segments[0]

    @property
    def longest_segment(self) -> int:
        return self.max_seqlen if self.document_ids is None else self._segments[1]

    @classmethod
    def from_lengths(cls, lengths: torch.Tensor, length: int | None = None) -> Unpadding:
        """Rows of ``lengths`` real tokens each, padded on the right to ``length`` (default: the longest)."""
        shortest, max_seqlen = int(lengths.min()), int(lengths.max())
        length = max_seqlen if length is None else length
        if shortest < 1 or max_seqlen > length:
            raise ValueError(f"row lengths run from {shortest} to {max_seqlen}; each must be between 1 and the "
                             f"padded length {length}")
        real = torch.arange(length, device=lengths.device) < lengths[:, None]  # (B, T)
        return cls(index=real.reshape(-1).nonzero().squeeze(1),
                   cu_seqlens=F.pad(lengths.cumsum(0, dtype=torch.int32), (1, 0)), max_seqlen=max_seqlen,
                   batch=real.shape[0], length=length, key_mask=real[:, None, None, :])

    @classmethod
    def from_loader(cls, batch: int, length: int, *, unpadded_index: torch.Tensor, cu_seqlens: torch.Tensor,
                    max_seqlen: int, segment_starts: torch.Tensor | None = None,
                    longest_segment: int | None = None) -> Unpadding:
        """The unpadding of a ``(batch, length)`` micro-batch from what the loader computed on the host
        (``pretrain.data.host_unpadding``): nothing is read back from the device, so the step queues without waiting."""
        lengths = cu_seqlens[1:] - cu_seqlens[:-1]
        real = torch.arange(length, device=cu_seqlens.device) < lengths[:, None]
        known = None if segment_starts is None else (segment_starts, int(longest_segment))
        return cls(index=unpadded_index, cu_seqlens=cu_seqlens, max_seqlen=int(max_seqlen), batch=batch, length=length,
                   key_mask=real[:, None, None, :], document_segments=known)

    @classmethod
    def from_attention_mask(cls, attention_mask: torch.Tensor) -> Unpadding:
        """The unpadding of a padded batch's ``(B, T)`` attention mask: 1 at real tokens, which come first."""
        real = attention_mask.bool()
        if not bool(real[:, 0].all()) or bool((real[:, 1:] & ~real[:, :-1]).any()):
            raise ValueError("padding-free mode needs every row padded on the right and starting with a real token "
                             "(attention_mask rows like 1 1 1 0 0); pad on the right, or run the padded mode")
        return cls.from_lengths(real.sum(1), real.shape[1])

    def unpad(self, x: torch.Tensor) -> torch.Tensor:
        """(B, T, ...) -> (N, ...): the real tokens only."""
        return x.reshape(self.batch * self.length, *x.shape[2:]).index_select(0, self.index)

    def pad(self, x: torch.Tensor) -> torch.Tensor:
        """(N, ...) -> (B, T, ...), zeros at padded positions."""
        grid = x.new_zeros(self.batch * self.length, *x.shape[1:]).index_copy(0, self.index, x)
        return grid.view(self.batch, self.length, *x.shape[1:])

    def positions(self, flat_positions: torch.Tensor) -> torch.Tensor:
        """Flat positions into the padded ``(batch*length)`` grid (e.g. masked tokens) -> their rows of the unpadded
        ``(N, ...)`` layout. Every position must be a real token: a padded one has no unpadded row."""
        rows = torch.full((self.batch * self.length,), -1, dtype=torch.long, device=self.index.device)
        order = torch.arange(len(self.index), device=self.index.device)
        unpadded = rows.index_copy_(0, self.index, order)[flat_positions]
        if bool((unpadded < 0).any()):
            raise ValueError("a masked position falls on padding, which padding-free mode drops; the batch's "
                             "masked_positions must index real tokens (pretrain.data.pad makes them so)")
        return unpadded

    def dropout(self, x: torch.Tensor, module: nn.Dropout) -> torch.Tensor:
        """``module`` on unpadded rows (N, C), with the mask it would draw for the padded (B*T, C) tensor.

        On CPU ``F.dropout`` draws ``bernoulli_(1 - p)`` over the whole tensor; drawing the same and keeping the
        real rows leaves the random stream, and so every later mask, as in the padded forward. The mask is
        float32 so that 1 / (1 - p) is not rounded to bf16 under autocast.
        """
        p = module.p
        if not module.training or p == 0.0:
            return x
        keep = torch.empty(self.batch * self.length, x.shape[-1], dtype=torch.float32, device=x.device)
        return (x * keep.bernoulli_(1 - p).index_select(0, self.index).div_(1 - p)).to(x.dtype)



# What the loader sends with a micro-batch for the padding-free path (``pretrain.data.host_unpadding``).
LOADER_FIELDS = ("unpadded_index", "cu_seqlens", "max_seqlen", "unpadded_masked_positions", "segment_starts",
                 "longest_segment")


def unpad_batch(attention_mask: torch.Tensor, masked_positions: torch.Tensor,
               loader_fields: dict) -> tuple[Unpadding, torch.Tensor]:
    """A padded micro-batch's ``Unpadding`` and its masked positions in the unpadded layout: from the sizes the loader
    computed on the host when it sent them (``LOADER_FIELDS``; no device read), else from the attention mask (a
    caller without the loader: the sizes are read back from the device)."""
    unknown = set(loader_fields) - set(LOADER_FIELDS)
    if unknown:
        raise TypeError(f"unexpected micro-batch inputs {sorted(unknown)}; the loader's unpadding fields are "
                        f"{', '.join(LOADER_FIELDS)}")
    if not loader_fields:
        unpadding = Unpadding.from_attention_mask(attention_mask)
        return unpadding, unpadding.positions(masked_positions)
    fields = dict(loader_fields)
    positions = fields.pop("unpadded_masked_positions")
    return Unpadding.from_loader(*attention_mask.shape, **fields), positions


def document_mask(document_ids: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
    """(B, 1, T, T) bool, True where query t may attend to key s: both real tokens of the same document. A padded
    query attends to every real token of its row (never to nothing, which SDPA would turn into NaN; its output is
    not read)."""
    same = document_ids[:, :, None] == document_ids[:, None, :]
    return ((same | ~real[:, :, None]) & real[:, None, :])[:, None]


def varlen_available() -> bool:
    return importlib.util.find_spec("torch.nn.attention.varlen") is not None


def choose(device: torch.device, attention_dropout: float) -> tuple[str, str]:
    """(kernel, why): ``varlen`` on CUDA when the model has no attention dropout and this torch has the kernel,
    ``sdpa-padded-grid`` otherwise."""
    if device.type != "cuda":
        return SDPA_PADDED_GRID, f"{device.type} has no variable-length kernel"
    if attention_dropout > 0:
        return SDPA_PADDED_GRID, (f"attention dropout {attention_dropout:g} (the variable-length kernel has none; "
                                  "set model.attention_probs_dropout_prob=0 to use it)")
    if not varlen_available():
        return SDPA_PADDED_GRID, f"torch {torch.__version__} has no torch.nn.attention.varlen"
    return VARLEN, "CUDA, no attention dropout"


def configure(model: nn.Module, device: torch.device) -> tuple[str, str]:
    """Choose the padding-free kernel for ``model`` on ``device`` (its largest attention dropout decides) and set it on
    every attention module; (kernel, why), for the run's log line."""
    dropout = max((m.dropout_p for m in model.modules() if hasattr(m, "unpadded_kernel")), default=0.0)
    kernel, why = choose(device, dropout)
    use(model, kernel)
    return kernel, why


def use(model: nn.Module, kernel: str) -> int:
    """Set ``kernel`` on every attention module of ``model`` that has a padding-free branch; how many there were."""
    if kernel not in KERNELS:
        raise ValueError(f"attention kernel {kernel!r}; choose one of {', '.join(KERNELS)}")
    modules = [m for m in model.modules() if hasattr(m, "unpadded_kernel")]
    for module in modules:
        module.unpadded_kernel = kernel
    return len(modules)


def segments(cu_seqlens: torch.Tensor, document_ids: torch.Tensor | None) -> tuple[torch.Tensor, int]:
    """(cumulative segment starts (S+1,) int32, longest segment) of unpadded tokens: a segment is a row
    (``cu_seqlens``), or with ``document_ids`` (N,) a run of one document within a row."""
    total = int(cu_seqlens[-1])
    starts = torch.zeros(total, dtype=torch.bool, device=cu_seqlens.device)
    starts[cu_seqlens[:-1].long()] = True
    if document_ids is not None:
        starts[1:] |= document_ids[1:] != document_ids[:-1]
    bounds = torch.cat([starts.nonzero().squeeze(1), torch.tensor([total], device=cu_seqlens.device)])
    return bounds.to(torch.int32), int((bounds[1:] - bounds[:-1]).max())


def varlen_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor,
                     max_seqlen: int) -> torch.Tensor:
    """Attention of unpadded (N, heads, head_size) query, key and value within each segment of ``cu_seqlens``."""
    from torch.nn.attention.varlen import varlen_attn  # CUDA's flash kernel; imported where it is used

    return varlen_attn(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen)


__all__ = ["KERNELS", "LOADER_FIELDS", "SDPA_PADDED_GRID", "VARLEN", "Unpadding", "choose", "configure",
           "document_mask", "segments", "unpad_batch", "use", "varlen_attention", "varlen_available"]
