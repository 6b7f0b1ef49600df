"""Quality harness: does cross-tokenizer distillation make a student better, and which loss wins?

Modules: ``task`` (seeded arithmetic corpus + Shakespeare text, prepared splits), ``toks`` (the
digit-splitting ``▁`` teacher tokenizer and the whole-number ``Ġ`` student tokenizer), ``prepare``
(teachers trained through the project's trainer in CE-only mode, projections; cached), ``arms``
(one generated run config per arm), ``evaluate`` (greedy exact-match accuracy), ``harness`` (run
arms x seeds, collect metrics), ``report`` (RESULTS.md table and plots). Entry point:
``python -m benchmarks.quality.run``; the shortened demo is ``xdistill demo distill``.
"""
