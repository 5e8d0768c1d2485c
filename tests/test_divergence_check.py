"""all_finite: a finite sum per tensor proves it finite; a non-finite sum (a NaN/inf element, or
finite elements whose sum overflows) is decided by the exact element-wise test."""

from __future__ import annotations

import pytest
import torch

from polytrain.runtime.divergence import all_finite

NAN, INF = float("nan"), float("inf")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("snapshot", [False, True])
def test_non_finite_elements_found(dtype: torch.dtype, snapshot: bool) -> None:
    for bad in ([1.0, NAN], [INF, 1.0], [-INF], [INF, -INF], [NAN, INF]):
        assert not all_finite([torch.ones(3, dtype=dtype), torch.tensor(bad, dtype=dtype)], snapshot)
    assert all_finite([torch.ones(3, dtype=dtype), None], snapshot)


def test_finite_values_whose_sum_overflows_are_finite() -> None:
    assert all_finite([torch.full((4,), 3e38)])  # float32 sum overflows to inf
    assert all_finite([torch.full((4,), 60000.0, dtype=torch.float16)])
    assert all_finite([torch.full((4,), 1e308, dtype=torch.float64)], snapshot=True)


def test_other_dtypes_and_empty() -> None:
    assert all_finite([]) and all_finite([torch.arange(5)])
    assert not all_finite([torch.tensor([1 + 1j, complex(NAN, 0)])])
    assert all_finite([torch.ones(2), torch.ones(2, dtype=torch.float64)])
