"""What a rank's hook gathered for the findings, to and from protobuf (agent and coordinator):
its checks' evidence and its environment. Part of the one adapter (`wire`), validated as it is.
"""

from __future__ import annotations

import functools

from watchdog.errors import MessageRejectedError
from watchdog.model import CHECK_KINDS, CheckEvidence, Environment, Fingerprint
from watchdog.transport.limits import (
    FINGERPRINT_OF,
    MAX_DEVICE,
    MAX_FINGERPRINTS,
    MAX_WORLD,
    cut_text,
    cut_texts,
)
from watchdog.transport.proto import watchdog_pb2 as pb

CHECK_BITS = {kind.check: 1 << bit for bit, kind in enumerate(CHECK_KINDS)}


def evidence_to_pb(e: CheckEvidence) -> pb.CheckEvidence:
    m = pb.CheckEvidence(
        checks=sum(CHECK_BITS.get(name, 0) for name in e.checks), unsynced_steps=e.unsynced_steps,
        fingerprints=[pb.Fingerprint(of=f.of, group=f.group, module=f.module, step=f.step,
                                     digest=f.digest) for f in e.fingerprints])
    if e.sampler_reuses:
        m.sampler_reuse.CopyFrom(pb.SamplerReuse(count=e.sampler_reuses,
                                                 first_step=e.sampler_reuse_step,
                                                 epoch=e.sampler_epoch))
    if e.ddp_change_step:
        m.ddp_module_change.CopyFrom(pb.DdpModuleChange(
            step=e.ddp_change_step, module=e.ddp_change_module, group=e.ddp_change_group,
            change=e.ddp_change))
    if e.nonfinite_step >= 0:
        m.nonfinite_loss.CopyFrom(pb.NonfiniteLoss(step=e.nonfinite_step,
                                                   value=e.nonfinite_value))
    return m


@functools.cache
def _checks_only(mask: int) -> CheckEvidence:
    """The evidence of a rank whose checks found nothing yet: most ranks, in most reports."""
    return CheckEvidence(checks=tuple(name for name, bit in CHECK_BITS.items() if mask & bit))


def evidence_from_pb(m: pb.CheckEvidence) -> CheckEvidence:
    mask = m.checks & (1 << len(CHECK_KINDS)) - 1
    if not (m.fingerprints or m.unsynced_steps or m.HasField("sampler_reuse")
            or m.HasField("ddp_module_change") or m.HasField("nonfinite_loss")):
        return _checks_only(mask)
    if len(m.fingerprints) > MAX_FINGERPRINTS:
        raise MessageRejectedError(f"{len(m.fingerprints)} fingerprints (at most "
                                   f"{MAX_FINGERPRINTS})")
    prints = tuple(Fingerprint(f.of, cut_text(f.group, "group name"), f.module, f.step,
                               f.digest) for f in m.fingerprints)
    reuse, change, loss = m.sampler_reuse, m.ddp_module_change, m.nonfinite_loss
    change_group, change_text = cut_texts(change.group, change.change)
    if any(f.of not in FINGERPRINT_OF for f in prints):
        raise MessageRejectedError("a fingerprint of something unknown")
    return CheckEvidence(
        checks=_checks_only(mask).checks, fingerprints=prints,
        unsynced_steps=m.unsynced_steps, sampler_reuses=reuse.count,
        sampler_reuse_step=reuse.first_step, sampler_epoch=reuse.epoch,
        ddp_change_step=change.step, ddp_change_module=change.module,
        ddp_change_group=change_group, ddp_change=change_text,
        nonfinite_step=loss.step if m.HasField("nonfinite_loss") else -1,
        nonfinite_value=loss.value)


def environment_to_pb(e: Environment) -> pb.RankEnvironment:
    return pb.RankEnvironment(torch=e.torch, cuda=e.cuda, nccl=e.nccl, python=e.python,
                              watchdog=e.watchdog, backend=e.backend, world_size=e.world_size,
                              group_device=e.group_device, module_device=e.module_device,
                              visible_devices=e.visible_devices)


def environment_from_pb(m: pb.RankEnvironment) -> Environment:
    torch, cuda, nccl, python, watchdog, backend, visible = cut_texts(
        m.torch, m.cuda, m.nccl, m.python, m.watchdog, m.backend, m.visible_devices)
    if m.world_size > MAX_WORLD:
        raise MessageRejectedError(f"environment world size {m.world_size} is out of range")
    if not (-1 <= m.group_device < MAX_DEVICE and -1 <= m.module_device < MAX_DEVICE):
        raise MessageRejectedError(f"CUDA device {m.group_device} or {m.module_device} is out "
                                   "of range")
    return Environment(torch=torch, cuda=cuda, nccl=nccl, python=python, watchdog=watchdog,
                       backend=backend, world_size=m.world_size, group_device=m.group_device,
                       module_device=m.module_device, visible_devices=visible)
