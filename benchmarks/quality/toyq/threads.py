"""Thread settings of the harness's training runs: one thread per run, which degrades gracefully.

The harness's models are tiny (the teacher: 3 layers, d = 96, 32 x 32 tokens per step), so a
step is a few hundred small operations. With 2 torch threads each operation is an OpenMP parallel
region ending in a barrier; when another process holds one of the two cores, every barrier waits
for the descheduled thread's next time slice, and a step slows down many-fold instead of 2x.
Measured (session 5) on a 2-core AMD EPYC VM, torch 2.13.0+cpu: the quality teacher's training
step (CE only, 32 x 32 tokens), seconds per step. "+1 busy" = one ``python -c "while True:
pass"`` next to it. The VM was shared with other people's test runs, so the idle and +1 busy
figures are the best of 3-4 runs (+1 busy below idle for 1 thread is that noise); "loaded" = the
busy loop plus other jobs using about two more cores (load average ~5), one run each:

    threads   idle     +1 busy   loaded
    1         0.078    0.073     0.29
    2         0.062    0.089     2.25

Idle, 2 threads are 1.26x faster. With one busy process they are 1.2x *slower* than 1 thread, and
on a loaded machine 7.7x slower (36x slower than idle: the user report behind this module saw
3.7 s per teacher step instead of 0.06 s), while 1 thread slows down about as much as the machine
is oversubscribed (3.7x). So a run gets 1 thread, always, and parallelism comes from running two
runs at a time (``--short`` trains the CE-only arm next to the teacher, then two arms at a time),
which shares the cores the way the OS scheduler expects. Adapting to ``os.getloadavg()`` was
rejected: the load seen at the start says nothing about work that starts later in the run.
"""

from __future__ import annotations

# torch / numba threads of every training run the harness and ``--short`` start
THREADS_PER_RUN = 1
