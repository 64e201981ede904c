"""A kernel module's versions as one table: `VERSIONS = {1: Version(...), 2: Version(...), ...}`.

A `Version` says what the version does (one line: `str(version)`), what runs it (`kernel`: the compiled kernel the
module's launcher starts, or the function that builds or launches it), what the GPU must have to run it (`needs`, a runtime.Capability), its traits (TRAITS) and what a
call costs under the simulator (`sim_cost`, a runtime.SimCost). The module's `launch`, its device checks and
`best` read the table, so a new version is one entry, its kernel and its test (fp8lab/kernels/README.md).
"""

from __future__ import annotations

import dataclasses
from typing import Callable

from .. import _validate as V
from ..device import runtime

TRAITS = {
    "tensor_cores": "its K-group sums come from the tensor cores (mma.sync or wgmma)",
    "limited_accumulation": "can emulate the tensor cores' limited-precision accumulator (accum_bits)",
    "persistent": "a grid of `sms` blocks, one per SM, loops over the output tiles",
    "streams": "launches on a CUDA stream it is given",
    "residual": "its epilogue can add a residual to the product (out = residual + A B^T)",
}


@dataclasses.dataclass(frozen=True)
class Version:
    """One row of a VERSIONS table (see the module docstring). `sim_costs` holds the simulator costs of variants
    other than the default, by name (fp8_gemm's "accum_bits")."""

    what: str
    kernel: Callable | tuple | None = None
    needs: runtime.Capability | None = None
    traits: frozenset = frozenset()
    sim_cost: runtime.SimCost | None = None
    sim_costs: dict = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        if not isinstance(self.what, str) or not self.what or "\n" in self.what:
            raise ValueError(f"what must be a one-line description, got {self.what!r}")
        traits = frozenset(self.traits)
        unknown = traits - set(TRAITS)
        if unknown:
            raise ValueError(f"traits must be among {sorted(TRAITS)}, got {sorted(unknown)}")
        object.__setattr__(self, "traits", traits)

    def __str__(self) -> str:
        return self.what

    def has(self, trait: str) -> bool:
        if trait not in TRAITS:
            raise ValueError(f"trait must be one of {sorted(TRAITS)}, got {trait!r}")
        return trait in self.traits

    def runs_here(self) -> bool:
        """Whether this device can run it (always under the simulator, which runs every instruction's twin)."""
        return self.needs is None or self.needs.here()

    def cost(self, variant: str | None = None) -> runtime.SimCost:
        """The simulator cost of the default (variant None) or a named variant."""
        return self.sim_cost if variant is None else self.sim_costs[variant]


def with_trait(versions: dict, trait: str) -> tuple:
    """The version numbers of the table that have `trait`, in order."""
    return tuple(v for v, row in versions.items() if row.has(trait))


def check_device(versions: dict, version: int) -> None:
    """ValueError naming the version when this GPU cannot run it (nothing under the simulator)."""
    needs = versions[version].needs
    if needs is not None:
        runtime.require(needs, version)


def best(versions: dict, preferred: int) -> int:
    """`preferred` (a module's BEST) where this device runs it; else the highest-numbered version it runs that needs
    no option (not persistent)."""
    if versions[preferred].runs_here():
        return preferred
    return max(v for v, row in versions.items() if row.runs_here() and not row.has("persistent"))


def select(name: str, value, versions: dict, default: int) -> int:
    """A version argument: None gives `default`, else an int key of the table; checked against this device."""
    version = V.version(name, value, versions, default=default)
    check_device(versions, version)
    return version


def check_table(versions: dict, best_version: int) -> None:
    """AssertionError unless `versions` is a contract table: keys 1..n in order, every value a Version, BEST one of
    them (the contract test runs this on every kernel module)."""
    assert isinstance(versions, dict) and list(versions) == list(range(1, len(versions) + 1)), \
        "VERSIONS: keys 1..n in order"
    for v, row in versions.items():
        assert isinstance(row, Version), f"VERSIONS[{v}] must be a kernels.versions.Version, got {type(row).__name__}"
        assert row.sim_cost is None or isinstance(row.sim_cost, runtime.SimCost), f"VERSIONS[{v}].sim_cost"
        assert all(isinstance(c, runtime.SimCost) for c in row.sim_costs.values()), f"VERSIONS[{v}].sim_costs"
    assert best_version in versions, f"BEST = {best_version!r} is not a version"
