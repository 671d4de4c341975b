"""A problem's fields as flashcheck's worker protocol sends them beside its
line (docs/external-subjects.md, "Cases"), and the storage shapes of its
tensors: what a worker needs to read its inputs and write its outputs
without parsing the line."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, List, Mapping, Optional, Tuple


@dataclass(frozen=True)
class Shape:
    """A problem's fields as the protocol sends them beside its line."""

    batch: int
    heads_q: int
    heads_kv: int
    seqlen_q: int
    seqlen_kv: int
    lens_q: Optional[List[int]]
    lens_kv: Optional[List[int]]
    head_dim: int
    head_dim_v: int
    dtype: str
    layout: str
    mask: str
    window_left: int
    window_right: int
    softmax_scale: float
    #: The score modifications (core/problem.hpp): s <- softcap tanh(s / softcap)
    #: after the scale (0: none), then s <- s - slope_h |i + (Lk - Lq) - j| with
    #: alibi (the standard slopes of heads_q heads). Sent only to a worker that
    #: declares them (capabilities "softcap", "alibi"); absent from older senders.
    softcap: float = 0.0
    alibi: bool = False
    #: A paged K/V cache (capability "min_page_size" > 0; core/paging.hpp):
    #: keys a page (0: contiguous), the pool's pages and the table's entries a
    #: sequence. Then input k and v are the pools, [pages, Hkv, page_size, D]
    #: (bshd: [pages, page_size, Hkv, D]), and input page_table ([B,
    #: pages_per_sequence], int32) names the pool page of each sequence's n-th
    #: page: key j of sequence b is slot j % page_size of page table[b][j // page_size].
    page_size: int = 0
    pages: int = 0
    pages_per_sequence: int = 0

    @classmethod
    def from_json(cls, fields: Mapping[str, Any]) -> "Shape":
        names = cls.__dataclass_fields__.keys()
        optional = {"softcap", "alibi", "page_size", "pages", "pages_per_sequence"}
        missing = [name for name in names if name not in fields and name not in optional]
        if missing:
            raise ValueError(f"the request's shape lacks {', '.join(missing)}")
        return cls(**{name: fields[name] for name in names if name in fields})

    def alibi_slope(self, h: int) -> float:
        """The standard ALiBi slope of query head h of heads_q (Press et al.)."""
        m = 1
        while m * 2 <= self.heads_q:
            m *= 2
        return 2.0 ** (-8.0 * (h + 1) / m) if h < m else 2.0 ** (-4.0 * (2 * (h - m) + 1) / m)

    def storage(self, heads: int, seqlen: int, dim: int, batch: Optional[int] = None) -> Tuple[int, int, int, int]:
        """A [B, H, S, D] tensor's shape in storage order: bhsd, or [B, S, H, D] for bshd."""
        batch = self.batch if batch is None else batch
        if self.layout == "bshd":
            return (batch, seqlen, heads, dim)
        return (batch, heads, seqlen, dim)

    def key_slot(self, table: List[float], b: int, j: int) -> Tuple[int, int]:
        """Where key j of sequence b lives in K and V: (b, j), or (pool page, slot) when paged."""
        if self.page_size == 0:
            return b, j
        return int(table[b * self.pages_per_sequence + j // self.page_size]), j % self.page_size

    @property
    def q_shape(self) -> Tuple[int, int, int, int]:
        return self.storage(self.heads_q, self.seqlen_q, self.head_dim)

    @property
    def k_shape(self) -> Tuple[int, int, int, int]:
        if self.page_size:
            return self.storage(self.heads_kv, self.page_size, self.head_dim, self.pages)
        return self.storage(self.heads_kv, self.seqlen_kv, self.head_dim)

    @property
    def v_shape(self) -> Tuple[int, int, int, int]:
        if self.page_size:
            return self.storage(self.heads_kv, self.page_size, self.head_dim_v, self.pages)
        return self.storage(self.heads_kv, self.seqlen_kv, self.head_dim_v)

    @property
    def o_shape(self) -> Tuple[int, int, int, int]:
        return self.storage(self.heads_q, self.seqlen_q, self.head_dim_v)

    @property
    def lse_shape(self) -> Tuple[int, int, int]:
        return (self.batch, self.heads_q, self.seqlen_q)

    # The backward's gradients have their inputs' shapes: dK and dV per K/V
    # head (summed over the query heads of a GQA group), dO has O's.
    dq_shape = q_shape
    dk_shape = k_shape
    dv_shape = v_shape
    do_shape = o_shape
