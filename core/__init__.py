"""The lowest layer: the run config's building blocks (``core.config``) and safe file writes
(``core.files``). It imports nothing from ``tasks``, ``strategies``, ``client_app`` or ``server_app``;
they all import from it."""
