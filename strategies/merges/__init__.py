"""The task-vector merges FIRM is compared with: AVG, SUM, TIES, FULM (LLM task).

They share FIRM's one ``query.fisher`` round (``strategies.firm``) and differ only in the merge
(``merge.py`` over ``maths.py``; ``strategy.py`` holds the four methods).
"""

from strategies.merges.settings import AVG, FULM, SUM, TIES
from strategies.registry import MethodSpec
from strategies.rmu.settings import KEYS as RMU_KEYS

_PAPER = "FIRM paper, sec. 5 baselines (`docs/firm.md`)"
_RELEASE = ("firm.forget-objective", "firm.fisher-batches", *RMU_KEYS)  # FIRM's client release, shared
_COMMON = dict(paper=_PAPER, reads=_RELEASE, task_kinds=("llm",), scenarios=("client", "sample"), smoke={"firm.fisher-batches": 2})

METHODS = (
    MethodSpec("avg", "the uploads FIRM gets, merged by the mean of forget and retain task vectors",
               "strategies.merges.strategy:AvgMerge", settings=AVG, **_COMMON, style=("#393b79", "<")),
    MethodSpec("sum", "the uploads FIRM gets, merged by the sum of forget task vectors",
               "strategies.merges.strategy:SumMerge", settings=SUM, **_COMMON, style=("#637939", ">")),
    MethodSpec("ties", "the uploads FIRM gets, merged by TIES (trim, elect sign, disjoint mean) of forget task vectors",
               "strategies.merges.strategy:TiesMerge", settings=TIES, **_COMMON, style=("#00008b", "d")),
    MethodSpec("fulm", "the uploads FIRM gets, clustered by cosine similarity and merged by TIES within clusters",
               "strategies.merges.strategy:FulmMerge", settings=FULM, **_COMMON, style=("#7b4173", "H")),
)
