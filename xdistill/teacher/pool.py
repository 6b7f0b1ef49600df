"""Several teachers at once, each with its own placement and transport.

    with TeacherPool(configs, projections={"qwen": proj_VsVt}) as pool:
        with pool.forward(batch) as outs:          # DistillBatch or a sequence of TeacherViews
            logp = outs["qwen"].proj_logp_BTtVs     # TeacherOutput per teacher name

``forward`` submits the batch to every remote teacher first, then runs the in-process ones
(colocated teachers are time-sliced in the training process while remote ones compute), then
collects. If any teacher fails, the outputs already collected are released and the first
TeacherError is raised.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from xdistill.errors import TeacherError
from xdistill.log import get_logger
from xdistill.teacher.client import TeacherClient, make_client
from xdistill.teacher.config import TeacherConfig
from xdistill.teacher.outputs import TeacherOutput

log = get_logger("teacher")


class TeacherResults(Mapping):
    """Outputs of one pool step by teacher name; releases every slot on ``release``/exit."""

    def __init__(self, leases: dict):
        self._leases = leases

    def __getitem__(self, name: str) -> TeacherOutput:
        return self._leases[name].output

    def __iter__(self):
        return iter(self._leases)

    def __len__(self) -> int:
        return len(self._leases)

    def release(self) -> None:
        for lease in self._leases.values():
            lease.release()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.release()


class TeacherPool:
    """Start, feed and stop a set of teachers (see module doc)."""

    def __init__(self, configs: Sequence[TeacherConfig], projections: dict | None = None,
                 engine_factories: dict | None = None, scheduling: dict | None = None):
        names = [c.name for c in configs]
        if len(set(names)) != len(names):
            raise TeacherError(f"teacher names must be unique, got {names}")
        projections, engine_factories = projections or {}, engine_factories or {}
        scheduling = scheduling or {}
        self.clients: dict[str, TeacherClient] = {}
        for cfg in configs:
            extra = {"scheduling_strategy": scheduling[cfg.name]} if cfg.name in scheduling else {}
            self.clients[cfg.name] = make_client(cfg, projections.get(cfg.name),
                                                 engine_factories.get(cfg.name), **extra)

    def start(self) -> None:
        """Launch every teacher, then wait until all are ready (loading overlaps)."""
        try:
            for client in self._ordered():
                client.start()
            for name, client in self.clients.items():
                client.wait_ready()
                log.info("teacher %r ready: %s on %s, outputs via %s", name, client.placement,
                         client.config.device, client.transport)
        except BaseException:
            try:
                self.close()
            except Exception as exc:   # the start's own error is the one to see
                log.warning("closing the teachers after a failed start also failed: %s: %s",
                            type(exc).__name__, exc)
            raise

    def check_tokenizers(self, toks: dict, keys: dict | None = None) -> None:
        """Each teacher's tokenizer must belong to its model (after :meth:`start`): no id beyond
        the model's output rows, and no far larger model vocabulary (padding to a multiple of 64
        or 128 -- Qwen2 pads 151,646 ids to 151,936 rows -- is fine; a model with three times
        the tokenizer's ids is another model). ``keys`` name each teacher's config key."""
        for name, client in self.clients.items():
            tok, info = toks.get(name), client.info
            if tok is None or info is None:
                continue
            rows, ids = int(info.vocab_size), int(tok.vocab_size)
            where = (keys or {}).get(name, f"teacher {name!r}")
            if ids > rows or rows - ids > max(1024, rows // 100):
                raise TeacherError(
                    f"{where}: tokenizer {tok.name!r} ({ids:,} ids) does not belong to teacher "
                    f"{name!r}'s model ({rows:,} output rows); give the model's own tokenizer")

    def _ordered(self):
        remote = [c for c in self.clients.values() if c.placement != "inprocess"]
        return remote + [c for c in self.clients.values() if c.placement == "inprocess"]

    def _views(self, batch) -> dict:
        views = getattr(batch, "teachers", batch)
        by_name = {v.name: v for v in views}
        unknown = sorted(set(by_name) - set(self.clients))
        if unknown:
            raise TeacherError(f"views for unknown teachers {unknown}; pool has "
                               f"{sorted(self.clients)}")
        return by_name

    def submit(self, batch) -> dict[str, int]:
        """Send each teacher its view (remote first); returns the step per teacher."""
        views = self._views(batch)
        steps = {}
        try:
            for client in self._ordered():
                if client.name in views:
                    steps[client.name] = client.submit(views[client.name])
        except BaseException:
            self.discard(steps)
            raise
        return steps

    def discard(self, steps: dict[str, int]) -> None:
        """Collect and release submitted steps whose outputs nobody will read (after a failure;
        teacher errors ignored)."""
        for name, step in steps.items():
            try:
                self.clients[name].collect(step).release()
            except TeacherError:
                pass

    def collect(self, steps: dict[str, int]) -> TeacherResults:
        leases, error = {}, None
        for name, step in steps.items():
            try:
                leases[name] = self.clients[name].collect(step)
            except TeacherError as exc:
                error = error or exc
        if error is not None:
            for lease in leases.values():
                lease.release()
            raise error
        return TeacherResults(leases)

    def forward(self, batch) -> TeacherResults:
        """Every teacher's output for ``batch`` (DistillBatch or sequence of TeacherViews)."""
        return self.collect(self.submit(batch))

    @property
    def has_remote(self) -> bool:
        """True when some teacher runs outside the training process (subprocess or Ray)."""
        return any(c.placement != "inprocess" for c in self.clients.values())

    @property
    def remote_slots(self) -> int:
        """The smallest slot ring of the remote teachers (0 without remote teachers)."""
        slots = [c.config.slots for c in self.clients.values() if c.placement != "inprocess"]
        return min(slots) if slots else 0

    def submit_remote(self, batch) -> dict[str, int]:
        """Send ``batch`` to the remote teachers only (they compute while this process works);
        :meth:`submit_inprocess` later runs the in-process teachers, :meth:`collect` gathers all."""
        views = self._views(batch)
        steps = {}
        try:
            for client in self.clients.values():
                if client.placement != "inprocess" and client.name in views:
                    steps[client.name] = client.submit(views[client.name])
        except BaseException:
            self.discard(steps)
            raise
        return steps

    def submit_inprocess(self, batch, remote_steps: dict[str, int]) -> dict[str, int]:
        """Run the in-process teachers on ``batch`` now (their outputs wait in their slots) and
        return every teacher's step, ``remote_steps`` (from :meth:`submit_remote`) included, for
        :meth:`collect`."""
        views = self._views(batch)
        steps = dict(remote_steps)
        try:
            for client in self.clients.values():
                if client.placement == "inprocess" and client.name in views:
                    steps[client.name] = client.submit(views[client.name])
        except BaseException:
            self.discard(steps)
            raise
        return steps

    def close(self) -> None:
        errors = []
        for client in self.clients.values():
            try:
                client.close()
            except Exception as exc:  # keep closing the others
                errors.append(f"{client.name}: {exc}")
        if errors:
            raise TeacherError("closing teachers failed: " + "; ".join(errors))

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()
