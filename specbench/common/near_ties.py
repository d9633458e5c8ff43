"""When two greedy decodes of one target may part and both be right: the float noise of a verify's logits per dtype
(NEAR_TIE), below which a top-2 margin is a near-tie, and where two token lists first differ. Shared by the report
(specbench.analysis.divergence) and `bench gpu` / `bench engine` (specbench.bench.common)."""

from __future__ import annotations

# bfloat16 keeps 8 significant bits, so logits of 16-32 are stored 0.125 apart; float16 keeps 11 bits, float32 24
NEAR_TIE = {"bfloat16": 0.5, "float16": 0.1, "float32": 0.01}


def near_tie_limit(dtype: object) -> float:
    """NEAR_TIE of a dtype (torch's or its name; None: float32, what a run that recorded none ran)."""
    return NEAR_TIE.get(str(dtype or "float32").removeprefix("torch."), NEAR_TIE["float32"])


def first_difference(a: list[int], b: list[int]) -> int:
    """The first position where two token lists differ (the shorter's length where one extends the other)."""
    return next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
