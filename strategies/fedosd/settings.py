"""FedOSD's run-config keys (``fedosd.*``). The learning-rate decay, local epochs and batch size are the
public code's CIFAR-10 command's; its rounds and learning rates (100 + 100 rounds at 0.0004 / 1e-6)
left the model unchanged on digits with LeNet-5, so the rounds and rates here are this project's
choice for digits, not the paper's (``docs/fedosd.md`` has the numbers and how far they were
checked)."""

from __future__ import annotations

from core.config import Setting, at_least, open_unit, positive, setting

SETTINGS: tuple[Setting, ...] = (
    setting("fedosd.unlearn-rounds", int, 20,
            "unlearning rounds: every client sends the gradient of its local loss, the server steps along the "
            "forget clients' gradient made orthogonal to the retained clients'", positive()),
    setting("fedosd.lr", float, 1.0, "learning rate of the unlearning rounds (the clients' local SGD and the "
            "server's step)", positive()),
    setting("fedosd.recovery-rounds", int, 10,
            "post-training rounds on the retained clients, each update stripped of its component along "
            "(w - w_start) (0 = none)", at_least(0)),
    setting("fedosd.recovery-lr", float, 0.05, "learning rate of the post-training rounds", positive()),
    setting("fedosd.lr-decay", float, 0.999, "each round multiplies the learning rate by this",
            open_unit(True)),
    setting("fedosd.epochs", int, 1, "local epochs of plain SGD (no momentum) behind each client's gradient",
            positive()),
    setting("fedosd.batch-size", int, 200, "local mini-batch size of that SGD", positive()),
)
