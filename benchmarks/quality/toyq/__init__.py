"""Quality harness: does cross-tokenizer distillation make a student better, and which loss wins?

Modules, in the order of a run: ``task`` (seeded arithmetic corpus + Shakespeare text, prepared
splits), ``toks`` (the digit-splitting ``▁`` teacher tokenizer and the whole-number ``Ġ`` student
tokenizer), ``prepare`` (teachers trained through the project's trainer in CE-only mode,
projections; cached), ``arms`` (one generated run config per arm, each with its published loss
weighting), ``runner`` (each trainer run is a watched child process: progress lines, stall
detection, one error naming the log), ``threads`` (one thread per run, and why), ``evaluate``
(greedy exact-match accuracy, bits per byte), ``harness`` (run arms x seeds, score them),
``summary`` (mean +- std per arm), ``report`` (RESULTS.md table, significance, plots), ``run``
(the command line), ``short`` (the shortened harness, ``run.py --short``). Entry point:
``python benchmarks/quality/run.py`` (reports into ``benchmarks/quality``), which puts this
package's folder on ``sys.path`` by being there.
"""
