"""Method name -> implementation. A new method is one file in strategies/ and one line here."""

from __future__ import annotations

from functools import partial

from strategies.base import NoUnlearning, Retrain, UnlearningMethod
from strategies.fedup import FedUP
from strategies.firm import BASELINES
from strategies.firm_method import FIRMMethod, MergeBaseline
from strategies.lethe import Lethe
from strategies.objective_unlearning import NPO, GradientAscent, SimNPO


def method_for(name: str) -> UnlearningMethod:
    """The method registered under ``name`` (names are validated by ``tasks.config`` first)."""
    factories = {"none": NoUnlearning, "retrain": Retrain, "lethe": Lethe, "fedup": FedUP,
                 "ga": GradientAscent, "npo": NPO, "simnpo": SimNPO, "firm": FIRMMethod,
                 **{baseline: partial(MergeBaseline, baseline) for baseline in BASELINES}}
    if name not in factories:
        raise ValueError(f"method {name!r} is not available: must be one of {', '.join(factories)}")
    return factories[name]()
