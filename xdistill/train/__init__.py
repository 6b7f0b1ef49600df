"""The trainer: one core loop (``core``) for the off-policy and on-policy modes, their configs
and steps."""
