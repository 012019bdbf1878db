"""The async snapshot's staging copy: bit-exact for every tensor kind, buffers reused.

``Staging.copy`` copies dense contiguous CPU tensors with libc's ``memmove`` and
everything else with ``Tensor.copy_``; both must give the source's exact bytes, and a
buffer must be reused only while its shape and dtype still match. Neither path may
keep a reference to the caller's memory: a staged tensor stays what it was when the
caller changes the source afterwards (the whole point of staging).
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from chaos.reference.checkpoint.async_writer import Staging, _plain_cpu

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8, torch.int64,
          torch.bool, torch.complex64]


def _random(shape: tuple[int, ...], dtype: torch.dtype, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    raw = torch.randint(0, 256, (max(1, torch.Size(shape).numel()) * torch.empty((), dtype=dtype).element_size(),),
                        generator=g, dtype=torch.uint8)
    n = torch.Size(shape).numel()
    return raw[: n * torch.empty((), dtype=dtype).element_size()].view(dtype).reshape(shape).clone()


def _same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (a.shape == b.shape and a.dtype == b.dtype
            and torch.equal(a.contiguous().reshape(-1).view(torch.uint8), b.contiguous().reshape(-1).view(torch.uint8)))


@settings(max_examples=60, deadline=None)
@given(dtype=st.sampled_from(DTYPES), shape=st.lists(st.integers(0, 9), min_size=0, max_size=3), seed=st.integers(0, 2**16))
def test_a_staged_tensor_has_the_source_bytes_and_keeps_them_after_the_source_changes(dtype, shape, seed):
    src = _random(tuple(shape), dtype, seed)
    staged = Staging().copy({"t": src})["t"]
    assert _same_bytes(staged, src)
    before = staged.clone()
    if src.numel():
        if dtype == torch.bool:
            src.logical_not_()
        else:
            src.reshape(-1).view(torch.uint8).add_(1)
    assert _same_bytes(staged, before), "staging must not alias the caller's tensor"
    if src.numel():
        assert staged.data_ptr() != src.data_ptr()


@pytest.mark.parametrize("make", [
    pytest.param(lambda t: t.t(), id="transposed"),
    pytest.param(lambda t: t[:, ::2], id="strided"),
    pytest.param(lambda t: t[1:], id="offset-view"),
])
def test_views_are_staged_with_their_own_values(make):
    base = torch.arange(48, dtype=torch.float32).reshape(6, 8)
    view = make(base)
    staged = Staging().copy({"v": view})["v"]
    assert torch.equal(staged, view) and staged.is_contiguous()


def test_conj_and_neg_views_are_staged_resolved_not_as_their_raw_bytes():
    z = torch.tensor([1 + 2j, 3 - 4j], dtype=torch.complex64)
    assert not _plain_cpu(z.conj()), "a lazy conj view's memory holds the un-conjugated values"
    staged = Staging().copy({"c": z.conj()})["c"]
    assert torch.equal(staged, torch.tensor([1 - 2j, 3 + 4j], dtype=torch.complex64))


def test_a_buffer_is_reused_while_shape_and_dtype_match_and_replaced_when_they_do_not():
    staging = Staging()
    first = staging.copy({"w": torch.ones(4)})["w"]
    again = staging.copy({"w": torch.full((4,), 2.0)})["w"]
    assert again.data_ptr() == first.data_ptr() and torch.equal(again, torch.full((4,), 2.0))
    reshaped = staging.copy({"w": torch.ones(2, 2)})["w"]
    assert reshaped.shape == (2, 2) and torch.equal(reshaped, torch.ones(2, 2))
    retyped = staging.copy({"w": torch.ones(2, 2, dtype=torch.float64)})["w"]
    assert retyped.dtype == torch.float64
    assert set(staging.copy({"x": torch.zeros(1)})) == {"x"}, "paths no longer staged are dropped"
