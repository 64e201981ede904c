"""Worksheets renumbered in lecture order (issue 29): a learner's copies in work/ may still carry the old names.

`fp8lab worksheets start` and `fp8lab grade` (fp8lab.course.worksheets) use this module to recognise such a copy and
say what to do with it. They never rename, move or delete it: a learner's work is only ever touched on request. And
`fp8lab grade ws5` never grades the old ws5 (inline PTX) as the new ws5 (the tiled GEMM): a copy is found by its full
file name, and an old copy that carries the number asked for is named in a note or an error.

Pure Python: `RENAMED`, `old_copies`, `advice`, `notes_for`, `on_start`, `on_grade_missing`.
"""

from __future__ import annotations

import os
from pathlib import Path

# old file name -> the file name of the same worksheet now (the one place that knows the old names)
RENAMED = {
    "ws1_fp8_encode_decode.ipynb": "ws2_fp8_encode_decode.ipynb",
    "ws2_rmsnorm_kernel.ipynb": "ws1_rmsnorm_kernel.ipynb",
    "ws3_tiled_gemm.ipynb": "ws5_tiled_gemm.ipynb",
    "ws4_tile_quantize_kernel.ipynb": "ws3_tile_quantize_kernel.ipynb",
    "ws5_inline_ptx.ipynb": "ws8_inline_ptx.ipynb",
    "ws6_pipeline_schedules.ipynb": "ws12_pipeline_schedules.ipynb",
    "ws7_limited_accumulation.ipynb": "ws6_limited_accumulation.ipynb",
    "ws8_delayed_scaling.ipynb": "ws4_delayed_scaling.ipynb",
    "ws9_fp8_linear_backward.ipynb": "ws10_fp8_linear_backward.ipynb",
    "ws10_training_recipe.ipynb": "ws11_training_recipe.ipynb",
    "ws11_wgmma_tile.ipynb": "ws9_wgmma_tile.ipynb",
    "ws12_fp8_gemm_promotion.ipynb": "ws7_fp8_gemm_promotion.ipynb",
}


def _number(file_name: str) -> str:
    return file_name.split("_")[0]


def _show(path: Path, root: Path | None) -> str:
    """path relative to the course root when it lies inside it (work/ws5_inline_ptx.ipynb), else as given."""
    if root is not None and path.resolve().is_relative_to(Path(root).resolve()):
        return os.path.relpath(path.resolve(), Path(root).resolve())
    return str(path)


def old_copies(work) -> dict[str, str]:
    """{old file name: file name now} of the copies in `work` that carry a worksheet's old name."""
    work = Path(work)
    return {old: new for old, new in RENAMED.items() if (work / old).is_file()}


def advice(old: str, work, root=None) -> str:
    """What to do with the copy work/<old>: rename it to the worksheet's name now (said, never done)."""
    new = RENAMED[old]
    work = Path(work)
    n = _number(new)
    what = (f"{_show(work / old, root)} is your copy of what is now {new.removesuffix('.ipynb')} (the worksheets "
            "were renumbered in lecture order)")
    if (work / new).exists():  # renaming would replace that copy: the learner chooses which one to keep
        return (f"{what}; {_show(work / new, root)} exists too, and is the one `fp8lab grade {n}` grades: grade the "
                f"old one with `fp8lab grade {_show(work / old, root)}`, or move its answers into the new one; "
                "nothing was renamed or deleted")
    return (f"{what}: rename it to {_show(work / new, root)} (`fp8lab worksheets start {n}` will then use it, and "
            f"`fp8lab grade {n}` grade it); nothing was renamed or deleted")


def notes_for(new_name: str, work, root=None) -> tuple[list[str], list[str]]:
    """(copies of worksheet `new_name` under its old name, copies of another worksheet that carry its number) in
    `work`, each as advice(...). ws5_tiled_gemm.ipynb: ([advice for ws3_tiled_gemm], [advice for ws5_inline_ptx])."""
    found = old_copies(work)
    mine = [advice(o, work, root) for o, n in found.items() if n == new_name]
    other = [advice(o, work, root) + f"; it is not {_number(new_name)} ({new_name.removesuffix('.ipynb')})"
             for o, n in found.items() if n != new_name and _number(o) == _number(new_name)]
    return mine, other


def on_start(new_name: str, work, root=None, *, have_copy: bool, fresh: bool) -> tuple[str | None, list[str]]:
    """(error, notes) for `fp8lab worksheets start` of worksheet `new_name`: an error when the learner's only copy of
    it carries its old name (a fresh copy beside it would hide their work: rename it, or ask with --fresh); notes
    for every other old-named copy that concerns it."""
    mine, other = notes_for(new_name, work, root)
    if mine and not have_copy and not fresh:
        return f"{mine[0]}; or start a new copy beside it: `fp8lab worksheets start {_number(new_name)} --fresh`", []
    return None, other + (mine if have_copy or fresh else [])


def on_grade_missing(copy: Path, root=None) -> str | None:
    """The error for `fp8lab grade wsN` when work/<copy> is missing but an old-named copy concerns it (None if none):
    this worksheet's copy under its old name, or another worksheet's copy that carries this number."""
    copy = Path(copy)
    mine, other = notes_for(copy.name, copy.parent, root)
    if mine:
        return f"{_show(copy, root)} does not exist. {mine[0]}"
    if other:
        n = _number(copy.name)
        return (f"{_show(copy, root)} does not exist. {other[0]}. To do {copy.stem}, start it with `fp8lab "
                f"worksheets start {n}`")
    return None
