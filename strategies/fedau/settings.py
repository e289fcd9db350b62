"""FedAU's run-config keys (``fedau.*``); defaults are the paper's and its public code's
(``--ul_samples_alpha`` 0.9, ``--ul_client_gamma`` 0.5)."""

from __future__ import annotations

from core.config import Setting, in_range, setting

SETTINGS: tuple[Setting, ...] = (
    setting("fedau.alpha", float, 0.9,
            "sample and client unlearning: the unlearned head is (1 - a) x W1 + a x the mean of the forget "
            "holders' auxiliary heads W2 (the paper's formula; class unlearning is W1 - mean W2)", in_range(0, 1)),
    setting("fedau.client-gamma", float, 0.5,
            "client scenario: before each pretraining round the leaving client restarts its auxiliary head "
            "from (1 - g) x the received W1 + g x its own W2 (the public code's whole-client mode); 0 = W1, "
            "1 = its W2 unchanged", in_range(0, 1)),
)
