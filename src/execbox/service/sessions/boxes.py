"""A session's box: made on first use on the current provider (pinned against a hot reload),
given the tenant's and the session's egress policy, checked before each use and recreated on the
next one after it died (SB009 once), destroyed.

Mixed into SessionManager; apart from ``manager.py`` (finding, creating and holding sessions)
because this is the part that talks to providers.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from ...errors import InvalidConfigError, ProviderUnavailableError
from ...providers.base import SandboxProvider
from .. import egress_hook
from . import notes
from .model import accepts
from .workspace import MOUNT_WAIT_SECONDS, make_workspace_dirs, remove_workspace

if TYPE_CHECKING:
    from .manager import SessionManager
    from .model import Session
    from .registry import SessionRecord

log = logging.getLogger("execbox.service.sessions")


class BoxesMixin:
    _orphans_due = 0.0  # time.monotonic() of the next periodic remove_orphan_boxes

    def _ensure_instance(self: SessionManager, s: Session, template: str) -> None:
        prov = s.provider
        if s.instance_id is not None and prov is not None:
            if not prov.initialized:  # provider swapped and shut down: move to the current one quietly
                s.instance_id = None
            elif not self._alive(prov, s.instance_id):
                dead = s.instance_id
                self._box_died(s, prov, dead)
                if not notes.dead_box_recreated_quietly():
                    raise ProviderUnavailableError(
                        f"the box of session {s.tenant_id}/{s.session_id} died; it is recreated on next use"
                        + (" with its workspace intact" if s.workspace else ""),
                        details={"box_died": True, "instance_id": dead, "recreated_on_next_use": True,
                                 "tenant_id": s.tenant_id, "session_id": s.session_id})
        if s.instance_id is None and s.pending_handle is not None:
            rec, s.pending_handle = s.pending_handle, None
            self._reattach(s, rec, retry=False)  # a box not answering yet: raises, the handle kept
            if s.instance_id is None:
                s.contexts_lost = True
        if s.instance_id is None:
            self._create_instance(s, template)

    def _reattach(self: SessionManager, s: Session, rec: SessionRecord, retry: bool = True) -> None:
        """Re-attach the session to the box its row names (lifecycle.py ``adopt_record``). When
        that cannot be told yet (no provider yet, its API or the box does not answer: it raises),
        the row's handle is kept and the session's next use tries again (``pending_handle``);
        that use itself (``retry`` False) raises to its caller."""
        try:
            prov = self.providers.current()  # none yet (still starting): as a box that cannot tell yet
            adopt = getattr(prov, "adopt_instance", None)
            if adopt is None or prov.name != rec.provider:
                return
            inst = adopt(rec.box_handle, tenant_id=rec.tenant_id, session_id=rec.session_id,
                         workspace=s.workspace)
        except Exception as e:
            log.warning("re-attaching %s/%s failed; tried again on its next use: %s", rec.tenant_id,
                        rec.session_id, e)
            s.pending_handle = rec
            if not retry:
                raise
            return
        if inst is not None:
            s.provider, s.instance_id = prov, inst.instance_id
            s.boxes_started = 1
            log.info("re-attached session %s/%s to its running box", rec.tenant_id, rec.session_id)

    @contextmanager
    def _leased(self: SessionManager) -> Iterator[SandboxProvider]:
        """The current provider, pinned (when the holder supports leases) so a hot reload cannot
        shut it down between choosing it and creating an instance on it."""
        lease = getattr(self.providers, "lease", None)
        if lease is None:
            yield self.providers.current()
            return
        with lease() as prov:
            yield prov

    def _create_instance(self: SessionManager, s: Session, template: str) -> None:
        with self._leased() as prov:
            self._create_on(prov, s, template)

    def _create_on(self: SessionManager, prov: SandboxProvider, s: Session, template: str) -> None:
        kwargs: dict[str, Any] = {"tenant_id": s.tenant_id, "session_id": s.session_id}
        if s.workspace and accepts(prov, "workspace"):
            self._make_workspace(s)
            kwargs["workspace"] = s.workspace
        else:
            s.workspace = None
        if s.runtime:
            if not accepts(prov, "runtime"):
                raise InvalidConfigError(f"provider {prov.name!r} does not support runtime templates "
                                         f"(runtime={s.runtime!r})", details={"field": "runtime"})
            kwargs["runtime"] = s.runtime
        labels = ({"execbox.registry": self.workspaces_root, "execbox.replica": self.replica}
                  if self.registry.persistent else None)
        if labels and accepts(prov, "labels"):
            kwargs["labels"] = labels
        try:
            inst = prov.create_instance(template=template, **kwargs)
        except BaseException as e:
            self._forget_unstarted(s)
            if _still_mounted(e):
                raise workspace_held(s) from e
            raise
        s.provider, s.instance_id = prov, inst.instance_id
        try:
            self._on_box_started(prov, s)  # the tenant cap and the session's egress policy
        except BaseException:
            # a box whose policy could not be set keeps the provider's: it must not serve the session
            s.instance_id = None
            try:
                prov.destroy_instance(inst.instance_id)
            except Exception:  # noqa: BLE001 - the error that matters is the one re-raised
                log.exception("destroying the box of %s/%s after its egress policy failed", s.tenant_id,
                              s.session_id)
            self._forget_unstarted(s)
            raise
        handle = {"instance_id": inst.instance_id, "workspace": s.workspace}
        meta = inst.metadata or {}
        container = meta.get("container_id") or meta.get("container")
        if container:  # a Docker container (its provider reads this key: older rows have only it)
            handle["container_id"] = container
        elif meta.get("box_id"):  # any other provider's box that outlives this process (a pod)
            handle["box_id"] = meta["box_id"]
        try:
            self.registry.update(s.tenant_id, s.session_id, state="running", provider=prov.name,
                                 runtime=s.runtime, box_handle=handle, contexts_lost=s.contexts_lost,
                                 expires_at=None, owner=self.replica,
                                 lease_expires=time.time() + self.settings.lease_ttl)
        except BaseException:  # no row names the box: it would outlive a crash unseen; the next use starts one
            s.instance_id = None
            self._destroy_instance(prov, inst.instance_id)
            try:
                self._forget_unstarted(s)
            except Exception:  # noqa: BLE001 - its row stays `creating`: dropped at the next start
                log.exception("forgetting session %s/%s failed", s.tenant_id, s.session_id)
            raise
        s.boxes_started += 1
        s.state = "running"
        mark = getattr(prov, "mark_box", None)
        if labels and "labels" not in kwargs and mark is not None:  # labels it could not take at create;
            try:  # only now that the row names the box: a marked box no row names is an orphan
                mark(inst.instance_id, labels)
            except Exception:  # noqa: BLE001 - unmarked, the box is only never taken for an orphan
                log.exception("marking the box of %s/%s failed", s.tenant_id, s.session_id)

    def _on_box_started(self: SessionManager, prov: SandboxProvider, s: Session) -> None:
        """Run after every session box start: the tenant cap and the session's narrowed egress policy."""
        egress_hook.apply(prov, s)

    def _on_oneshot_started(self: SessionManager, prov: SandboxProvider, tenant_id: str, instance_id: str) -> None:
        """Run after a one-shot box starts: the tenant's egress cap."""
        egress_hook.apply_to(prov, tenant_id, instance_id)

    def _make_workspace(self: SessionManager, s: Session) -> None:
        with self._lock:
            pending = self._deleting.get(s.workspace or "")
        if pending is not None:  # the previous session of this name is still being removed
            pending.wait(MOUNT_WAIT_SECONDS + 5)
        make_workspace_dirs(self.workspaces_root, s.tenant_id, s.workspace or "", self.workspaces_base)

    def _forget_unstarted(self: SessionManager, s: Session) -> None:
        """A session whose first box never started (a request that made it failed or was refused
        before one did) does not count against any limit: it goes; any other session stays."""
        if s.boxes_started or s.state != "creating":
            return
        with self._lock:
            if self._sessions.get((s.tenant_id, s.session_id)) is s and s.busy <= 1:
                del self._sessions[(s.tenant_id, s.session_id)]
                self._dirty.pop((s.tenant_id, s.session_id), None)
                s.closed = True
        if s.closed:
            self.registry.delete(s.tenant_id, s.session_id)
            notes.note_forgotten(s.tenant_id, s.session_id)  # the request that made it did not, after all
            if s.workspace:
                remove_workspace(s.workspace)

    def remove_orphan_boxes(self: SessionManager, periodic: bool = False) -> None:
        """Remove the boxes marked with this registry that no row names (the provider's
        ``remove_orphans``): at start, and (``periodic``) at most every ``ORPHANS_EVERY`` s from
        the sweep, for providers whose ``remove_orphans`` spares boxes being created (an
        ``orphan_grace``: Kubernetes), so boxes marked within the grace before a start go too."""
        prov = self._current_or_none()
        orphans = getattr(prov, "remove_orphans", None)
        if orphans is None or not self.registry.persistent:
            return
        if periodic:
            if getattr(prov, "orphan_grace", None) is None or time.monotonic() < self._orphans_due:
                return
            self._orphans_due = time.monotonic() + ORPHANS_EVERY
        try:
            orphans(self._box_ids(), self.workspaces_root)
        except Exception:  # noqa: BLE001
            log.exception("removing orphan boxes failed")

    def _remove_pending_box(self: SessionManager, s: Session) -> None:
        """Remove, by its row's handle, the box of a session not re-attached yet (``pending_handle``)
        that is destroyed or paused: a provider that cannot remove it now raises (the caller keeps
        the row, with the handle, for a later try)."""
        rec, prov = s.pending_handle, self._current_or_none()
        if rec is not None and prov is None:  # still starting: the box cannot be removed yet, nor forgotten
            raise ProviderUnavailableError(
                f"the provider is not ready to remove session {s.tenant_id}/{s.session_id}'s box; retry",
                details={"reason": "provider_starting"})
        remover = getattr(prov, "remove_box", None)
        if rec is not None and remover is not None and getattr(prov, "name", None) == rec.provider:
            remover(rec.box_handle)
        s.pending_handle = None

    @staticmethod
    def _alive(prov: SandboxProvider, instance_id: str) -> bool:
        probe = getattr(prov, "instance_alive", None)
        return True if probe is None else bool(probe(instance_id))

    def _drop_if_dead(self: SessionManager, s: Session) -> None:
        """After an SB009/SB006 the error already told the client; the next use starts a new box."""
        if s.provider is None or s.instance_id is None:
            return
        if not self._alive(s.provider, s.instance_id):
            self._box_died(s, s.provider, s.instance_id)

    def _box_died(self: SessionManager, s: Session, prov: SandboxProvider, instance_id: str) -> None:
        """Tear down a session's dead box; its contexts (interpreter state) went with it, which the
        next run reports once (``contexts_lost``), as after a restart or a pause."""
        self._destroy_instance(prov, instance_id)
        s.instance_id = None
        s.contexts_lost = True
        self.registry.update(s.tenant_id, s.session_id, contexts_lost=True)
        if self.metrics is not None:
            self.metrics.boxes_died.inc()

    @staticmethod
    def _destroy_instance(prov: SandboxProvider, instance_id: str) -> None:
        try:
            prov.destroy_instance(instance_id)
        except Exception:  # noqa: BLE001 - a dead box may fail to tear down; nothing else to do
            log.exception("destroying instance %s failed", instance_id)


HELD_RETRY = 1
"""Retry-After (seconds) while a previous box still holds a session's workspace."""
ORPHANS_EVERY = 300.0
"""Seconds between two periodic orphan-box removals of one replica (``remove_orphan_boxes``)."""


def _still_mounted(e: BaseException) -> bool:
    """Was a box start refused because a previous box still has the workspace mounted
    (``quota.StillMounted``, wrapped by the provider as SB004)?"""
    from ...boxes.quota import StillMounted

    seen: BaseException | None = e
    for _ in range(8):
        if seen is None:
            return False
        if isinstance(seen, StillMounted):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def workspace_held(s: Any) -> ProviderUnavailableError:
    """503 SB009 (not SB004 "no capacity"): the session's previous box (a previous owner's that has
    not stopped yet: frozen, or fenced and still stopping) still holds its workspace."""
    err = ProviderUnavailableError(
        f"session {s.tenant_id}/{s.session_id}: its workspace is still held by the box of its previous owner "
        "(a replica that stopped answering, or one still stopping its boxes); retry",
        details={"reason": "previous_owner_holds_workspace", "tenant_id": s.tenant_id,
                 "session_id": s.session_id, "retry_after": HELD_RETRY})
    err.retry_after = HELD_RETRY  # type: ignore[attr-defined]
    return err
