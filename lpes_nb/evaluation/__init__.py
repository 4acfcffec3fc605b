"""Scoring a model on the tasks: task definitions (tasks), metrics, shared-prefix prompts
(prefix), decoding and scoring (evaluate), the GA's fitness and its parallel pools (fitness,
distributed), the position gate's statistics (position_gate), and the one trained baseline, MoICE,
with its training loop (moice, training)."""
