"""The project's guards: opt-in rules around an unlearning method's phases (ours, not a paper's).

A method's defaults are its paper's; a guard is one of our own rules, each switched on by its own
``guard.*`` key and off at its default, so that ``method='X'`` alone runs X's paper. Named recipes
(``recipes/*.toml``, ``recipe='lethe-robust'``) switch several on together; ``docs/guards.md`` says what
each does and the ablation that measures what it buys. Today Lethe is the method that honours them
(``strategies.lethe``); a guard is written on what any iterative method has (a forget loss, the
retained clients' loss, an update step, a check of the forget set after the run), so another method
can honour the same key.

The pure rules they use live beside the method that applies them (``strategies.lethe.maths``:
``rectify_verdict``, ``clip_to_reference``, ``lift_retain``, ``layer_gammas``).
"""

from __future__ import annotations

from core.config import Setting, at_least, one_of, positive, setting

INF = float("inf")

#: the share of the forget set the backbone may still predict as its label when the loss stop fires
STOP_FORGET_ACC = 0.05
#: the share of the forget set a restored model may still predict as its label (the verify check)
VERIFY_FORGET_ACC = 0.02
#: the retain stream a verify pass lifts to, as a multiple of the forget stream's norm
VERIFY_LIFT = 0.1
#: bisection probes of the walk-back for the largest passing fraction of the step it undid
WALK_BACK_SEARCH = 3
#: how far (nats) above the walk-back's checkpoint such a fraction's retained loss may be
WALK_BACK_SEARCH_RISE = 0.05
#: restores from one rectification step earlier where restore's own rollback acted
RESTORE_RETRIES = 2
#: the retained loss (nats above the start) that ends the rectified restore's extra rounds
RESTORE_TARGET_RISE = 0.02

GUARD_SETTINGS: tuple[Setting, ...] = (
    setting("guard.bounded-ascent", float, INF,
            "amplify: the adapter takes normalised ascent steps of length lethe.adapter-lr and stops once a batch's "
            "forget loss reaches this many nats (a saturated loss ascends the label margin instead); inf = the "
            "paper's plain ascent", positive(), allow_inf=True),
    setting("guard.gamma-rule", str, "fixed",
            "fixed: lethe.gamma in every layer (the paper); upper: each aligned layer's upper Prop. IV.1 bound "
            "|Δr|²/s; clamp: lethe.gamma clipped into each layer's Prop. IV.1 interval",
            one_of(("fixed", "upper", "clamp"))),
    setting("guard.stop-loss", float, INF,
            "rectification stops once the forget clients' mean forget loss of the backbone (adapter bypassed) "
            f"reaches this many nats and the backbone predicts at most {STOP_FORGET_ACC * 100:g} % of the forget set "
            "as its label; a step past 3x it (or non-finite) is halved up to three times, else rolled back; inf = "
            "always lethe.rectify-rounds (the paper)", positive(), allow_inf=True),
    setting("guard.step-clip", float, 0.0,
            "each rectified update is scaled to at most this x the retain stream's norm (a verify pass first lifts a "
            f"retain stream shorter than {VERIFY_LIFT:g} x the forget stream to that length); 0 = off", at_least(0)),
    setting("guard.retain-rise", float, INF,
            "a rectification step after which the retained clients' loss is more than this many nats above their "
            "loss on the starting model is rolled back (a pass's first step is halved first); a restored model "
            "that far above the original's is restored again at half, then a quarter of the lr, and a pass "
            "still past it is not carried out; inf = off", positive(), allow_inf=True),
    setting("guard.rectified-restore", bool, False,
            "restore trains the forget and the retained clients and applies the retain stream without its "
            "component along the forget stream, keeping the model its retained clients rate best (after at "
            "least two steps); false = the paper's FedAvg restore on the retained clients"),
    setting("guard.restore-extra-rounds", int, 0,
            f"with guard.rectified-restore: while no model restore may keep is within {RESTORE_TARGET_RISE:g} nats of "
            "the retained loss on the start, up to this many more restore rounds, each applying half its update", at_least(0)),
    setting("guard.walk-back", float, INF,
            "with guard.rectified-restore: while the adapter-free backbone's retained loss is more than this many "
            "nats above the start, one rectification step is undone, then the largest passing fraction of it is "
            "taken back; inf = off", positive(), allow_inf=True),
    setting("guard.retry-walk-back", float, 0.0,
            "where an attempt leaves the request not carried out, one more attempt from the original with "
            "guard.walk-back at this value, kept where it carries the request out or knows less of the forget "
            "set; at most guard.walk-back = no retry", at_least(0)),
    setting("guard.verify-passes", int, 0,
            "after restore the forget clients check the model; while it predicts more than "
            f"{VERIFY_FORGET_ACC * 100:g} % of the forget set as its label, at most this many more passes of amplify, "
            "rectify and restore from it (a pass that breaks guard.retain-rise is not kept); 0 = off", at_least(0)),
)
