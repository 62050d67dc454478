"""Kubernetes as a job source: pods asking for `nvidia.com/gpu`, through the official client.

- **Pods**: those in phase Running (all namespaces, or `namespace`) whose containers ask for
  `nvidia.com/gpu` (extended resources are set in `limits`), with their node. Listed on every
  look; a watch on the same pods calls `changed()` on every event, so a pod that starts or
  ends is looked at at once, not at the next poll.
- **Jobs**: the pods of one training job are one job: grouped by the `flexgate.io/job`
  annotation when set, else by their controller (owner reference: a Job, a PyTorchJob ...),
  else each pod is its own job. The id is `namespace/name`.
- **GPU indices**: the API server never carries device ids. Each node's agent reads them from
  its kubelet (PodResources) and reports them in its telemetry; `pod_gpus()` (given by the
  gateway, from its fleet) answers them by (node, namespace, pod). A pod that just started
  may not be in its agent's report yet: it is asked again, `JOIN_TRIES` times.
- **Tier and PFI**: annotations `flexgate.io/tier` (0 to 3) and `flexgate.io/pfi`, the same on
  every pod of the job.
- **Expected end** from `activeDeadlineSeconds`; **user** the pods' service account, **account**
  their namespace.

Errors of the API (a refusal, a timeout, an answer that is not a pod list) raise
`JobSourceError`; a pod or job that cannot be read is a `JobProblem`.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from flexmodel.jobs import Placement
from gateway.errors import JobSourceError
from gateway.jobsource.base import (
    JobProblem,
    SourceJob,
    SourceReading,
    TagError,
    parse_pfi,
    parse_tier,
)

log = logging.getLogger("flexgate.gateway")

GPU_RESOURCE = "nvidia.com/gpu"
JOB_ANNOTATION = "flexgate.io/job"
TIER_ANNOTATION = "flexgate.io/tier"
PFI_ANNOTATION = "flexgate.io/pfi"
RUNNING = "status.phase=Running"
#: How often, and how far apart, a pod missing from its agent's report is asked for again.
JOIN_TRIES, JOIN_WAIT_S = 3, 1.0
#: A watch that failed is opened again after this long [s].
REWATCH_S = 1.0

#: (node, namespace, pod) -> the pod's GPU indices on that node
PodGpus = Mapping[tuple[str, str, str], tuple[int, ...]]


def open_api(kubeconfig: Path | None) -> Any:
    """The client's ApiClient: from a kubeconfig file, or inside a cluster its service account."""
    from kubernetes import client, config

    if kubeconfig is not None:
        return config.new_client_from_config(config_file=str(kubeconfig))
    configuration = client.Configuration()
    config.load_incluster_config(client_configuration=configuration)
    return client.ApiClient(configuration)


@dataclass(frozen=True)
class GpuPod:
    namespace: str
    name: str
    node: str
    gpus: int
    job: str  #: the id of the job it belongs to
    annotations: Mapping[str, str]
    service_account: str | None
    start: Any  #: datetime | None
    deadline_s: int | None


class KubernetesSource:
    kind = "kubernetes"

    def __init__(
        self,
        api: Any,
        pod_gpus: Callable[[], Awaitable[PodGpus]],
        *,
        timeout_s: float,
        namespace: str = "",
        watch_s: float = 300.0,
    ) -> None:
        from kubernetes import client

        self.api, self.pod_gpus, self.timeout_s = api, pod_gpus, timeout_s
        self.namespace, self.watch_s = namespace, watch_s
        self.core = client.CoreV1Api(api)
        self._closed = threading.Event()
        self._watching: Any = None

    # --- reading -------------------------------------------------------------------------

    async def read(self) -> SourceReading:
        listing = await asyncio.to_thread(self._list)
        pods, problems = gpu_pods(listing)
        gpus = await self.pod_gpus()
        for _ in range(JOIN_TRIES - 1):
            if all((p.node, p.namespace, p.name) in gpus for p in pods):
                break
            await asyncio.sleep(JOIN_WAIT_S)
            gpus = await self.pod_gpus()
        jobs, more = group_jobs(pods, gpus)
        return SourceReading(tuple(jobs), tuple(problems + more))

    def _list(self) -> Any:
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        options: dict[str, Any] = {"field_selector": RUNNING, "_request_timeout": self.timeout_s}
        try:
            if self.namespace:
                listing = self.core.list_namespaced_pod(self.namespace, **options)
            else:
                listing = self.core.list_pod_for_all_namespaces(**options)
        except ApiException as exc:  # the client's errors, translated at the edge
            raise JobSourceError(f"the Kubernetes API refused the pod list: {_say(exc)}") from exc
        except (HTTPError, OSError) as exc:
            raise JobSourceError(f"the Kubernetes API did not answer: {_say(exc)}") from exc
        except Exception as exc:  # the client could not read the answer as a pod list
            raise JobSourceError(
                "the Kubernetes API answered something that is not a pod list "
                f"({type(exc).__name__}: {str(exc).splitlines()[0]})"
            ) from exc
        if not isinstance(getattr(listing, "items", None), list):
            raise JobSourceError("the Kubernetes API answered something that is not a pod list")
        return listing

    # --- watching ------------------------------------------------------------------------

    async def watch(self, changed: Callable[[], None]) -> None:
        """Watch the pods in a thread of its own (the client blocks) until `close()`."""
        loop = asyncio.get_running_loop()
        done = asyncio.Event()

        def notify() -> None:
            loop.call_soon_threadsafe(changed)

        def run() -> None:
            try:
                self._watch_until_closed(notify)
            finally:
                loop.call_soon_threadsafe(done.set)

        threading.Thread(target=run, name="flexgate-k8s-watch", daemon=True).start()
        await done.wait()

    def _watch_until_closed(self, changed: Callable[[], None]) -> None:
        from kubernetes import watch

        while not self._closed.is_set():
            self._watching = watch.Watch()
            options: dict[str, Any] = {
                "field_selector": RUNNING,
                "timeout_seconds": int(self.watch_s),
                "_request_timeout": self.watch_s + self.timeout_s,
            }
            call: Any = self.core.list_pod_for_all_namespaces
            if self.namespace:
                call, options["namespace"] = self.core.list_namespaced_pod, self.namespace
            try:
                for _event in self._watching.stream(call, **options):
                    changed()
                    if self._closed.is_set():
                        break
            except Exception as exc:  # looked at again by the poll; the watch reopens
                log.warning("job source kubernetes: the pod watch failed: %s", _say(exc))
                self._closed.wait(REWATCH_S)

    async def close(self) -> None:
        self._closed.set()
        if self._watching is not None:
            self._watching.stop()
        await asyncio.to_thread(self.api.close)


def _say(exc: Exception) -> str:
    status = getattr(exc, "status", None)
    reason = getattr(exc, "reason", None)
    if status is not None:
        return f"HTTP {status} {reason or ''}".strip()
    return f"{type(exc).__name__}: {exc}"


def gpu_pods(listing: Any) -> tuple[list[GpuPod], list[JobProblem]]:
    """The running pods that ask for GPUs; a pod that cannot be read is a problem of its job,
    and none of that job's pods is kept."""
    pods, problems = [], []
    for pod in listing.items:
        meta = pod.metadata
        where = f"{getattr(meta, 'namespace', '?')}/{getattr(meta, 'name', '?')}"
        try:
            job = job_of(meta)
        except (TypeError, AttributeError):
            job = where
        try:
            gpus = requested_gpus(pod.spec.containers or [])
            if gpus == 0 or pod.status.phase != "Running":
                continue
            if not pod.spec.node_name:
                raise ValueError("it runs on no node")
            pods.append(
                GpuPod(
                    namespace=meta.namespace,
                    name=meta.name,
                    node=pod.spec.node_name,
                    gpus=gpus,
                    job=job,
                    annotations=meta.annotations or {},
                    service_account=pod.spec.service_account_name,
                    start=pod.status.start_time,
                    deadline_s=pod.spec.active_deadline_seconds,
                )
            )
        except (ValueError, TypeError, AttributeError) as exc:
            problems.append(JobProblem(job, f"pod {where} cannot be read: {exc}"))
    unreadable = {p.id for p in problems}  # a job is whole or not at all
    return [p for p in pods if p.job not in unreadable], problems


def requested_gpus(containers: list[Any]) -> int:
    """The GPUs a pod's containers ask for (`limits`, where extended resources are set)."""
    total = 0
    for container in containers:
        limits = (container.resources.limits if container.resources else None) or {}
        value = limits.get(GPU_RESOURCE)
        if value is None:
            continue
        if not str(value).isdigit():
            raise ValueError(f"container '{container.name}' asks for {value!r} {GPU_RESOURCE}")
        total += int(value)
    return total


def job_of(meta: Any) -> str:
    """The job a pod belongs to: its annotation, else its controller, else the pod itself."""
    named = (meta.annotations or {}).get(JOB_ANNOTATION)
    if named:
        return f"{meta.namespace}/{named}"
    for owner in meta.owner_references or []:
        if owner.controller:
            return f"{meta.namespace}/{owner.name}"
    return f"{meta.namespace}/{meta.name}"


def group_jobs(pods: list[GpuPod], gpus: PodGpus) -> tuple[list[SourceJob], list[JobProblem]]:
    """The pods of each job as one job, placed with the indices the agents reported."""
    by_job: dict[str, list[GpuPod]] = {}
    for pod in pods:
        by_job.setdefault(pod.job, []).append(pod)
    jobs, problems = [], []
    for job_id, members in sorted(by_job.items()):
        try:
            jobs.append(one_job(job_id, members, gpus))
        except (TagError, ValueError) as exc:
            problems.append(JobProblem(job_id, str(exc)))
    return jobs, problems


def one_job(job_id: str, pods: list[GpuPod], gpus: PodGpus) -> SourceJob:
    per_node: dict[str, list[int]] = {}
    for pod in pods:
        indices = gpus.get((pod.node, pod.namespace, pod.name))
        if indices is None:
            raise ValueError(
                f"pod {pod.namespace}/{pod.name}: the agent of node '{pod.node}' reports no GPUs "
                "for it (PodResources: FLEXGATE_AGENT_PODRESOURCES_SOCKET)"
            )
        if len(indices) != pod.gpus:
            raise ValueError(
                f"pod {pod.namespace}/{pod.name} asks for {pod.gpus} GPUs but its agent "
                f"reports {len(indices)}"
            )
        per_node.setdefault(pod.node, []).extend(indices)
    tier = agreed(pods, TIER_ANNOTATION, parse_tier)
    pfi = agreed(pods, PFI_ANNOTATION, parse_pfi)
    starts = [p.start for p in pods if p.start is not None]
    ends = [
        p.start + timedelta(seconds=p.deadline_s)
        for p in pods
        if p.start is not None and p.deadline_s is not None
    ]
    return SourceJob(
        id=job_id,
        gpus=sum(len(v) for v in per_node.values()),
        placement=tuple(Placement(node, tuple(sorted(v))) for node, v in sorted(per_node.items())),
        start=min(starts, default=None),
        end=min(ends, default=None),
        tier=tier,
        pfi=pfi,
        user=pods[0].service_account,
        account=pods[0].namespace,
    )


def agreed(pods: list[GpuPod], key: str, parse: Callable[[str], Any]) -> Any:
    """The value of annotation `key` on the job's pods (None when absent), read by `parse`."""
    values = {p.annotations[key] for p in pods if key in p.annotations}
    if len(values) > 1:
        raise TagError(f"its pods disagree on {key}: {', '.join(sorted(values))}")
    if not values:
        return None
    try:
        return parse(values.pop())
    except TagError as exc:
        raise TagError(f"annotation {key}: {exc}") from None
