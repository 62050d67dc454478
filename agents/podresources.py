"""Which GPUs each Kubernetes pod holds on this node: the kubelet's PodResources API.

The Kubernetes API server never carries device ids; only the node's kubelet knows them, and
answers `List` (`v1.PodResourcesLister`, gRPC on a unix socket, by default
`/var/lib/kubelet/pod-resources/kubelet.sock`) with each pod's containers and the devices of
each resource they were given. The NVIDIA device plugin names GPUs by UUID (or by index, with
`DEVICE_ID_STRATEGY=index`); `PodGpuReader` turns them into this node's GPU indices, which the
agent reports in its telemetry (`pods`) for the gateway to join with the pods' API objects.

The messages are built here from the kubelet's v1 API (the fields `List` uses, with their
numbers), so no generated code is needed; grpcio loads only when a socket is configured.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from agents.protocol import PodGpus

DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
GPU_RESOURCE = "nvidia.com/gpu"
LIST_METHOD = "/v1.PodResourcesLister/List"


class PodResourcesError(Exception):
    """The kubelet's PodResources service did not answer."""


@lru_cache(maxsize=1)
def messages() -> tuple[Any, Any]:
    """The request and response classes of `List` (kubelet API v1)."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    proto = descriptor_pb2.FileDescriptorProto(
        name="flexgate/podresources_v1.proto", package="v1", syntax="proto3"
    )
    F = descriptor_pb2.FieldDescriptorProto
    string, repeated, optional, message = (
        F.TYPE_STRING,
        F.LABEL_REPEATED,
        F.LABEL_OPTIONAL,
        F.TYPE_MESSAGE,
    )

    def add(name: str, *fields: tuple[str, int, int, int, str]) -> None:
        kind = proto.message_type.add(name=name)
        for field, number, label, type_, type_name in fields:
            entry = kind.field.add(name=field, number=number, label=label, type=type_)
            if type_name:
                entry.type_name = type_name

    add("ListPodResourcesRequest")
    add(
        "ContainerDevices",
        ("resource_name", 1, optional, string, ""),
        ("device_ids", 2, repeated, string, ""),
    )
    add(
        "ContainerResources",
        ("name", 1, optional, string, ""),
        ("devices", 2, repeated, message, ".v1.ContainerDevices"),
    )
    add(
        "PodResources",
        ("name", 1, optional, string, ""),
        ("namespace", 2, optional, string, ""),
        ("containers", 3, repeated, message, ".v1.ContainerResources"),
    )
    add("ListPodResourcesResponse", ("pod_resources", 1, repeated, message, ".v1.PodResources"))
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return (
        message_factory.GetMessageClass(pool.FindMessageTypeByName("v1.ListPodResourcesRequest")),
        message_factory.GetMessageClass(pool.FindMessageTypeByName("v1.ListPodResourcesResponse")),
    )


@dataclass(frozen=True)
class PodDevices:
    namespace: str
    name: str
    device_ids: tuple[str, ...]  #: of `GPU_RESOURCE`, every container together


class PodResourcesClient:
    """`List` on the kubelet's socket; `PodResourcesError` when it does not answer."""

    def __init__(self, socket_path: str = DEFAULT_SOCKET, *, timeout_s: float = 2.0) -> None:
        import grpc

        self._grpc = grpc
        self.socket_path, self.timeout_s = socket_path, timeout_s
        self._channel = grpc.insecure_channel(f"unix://{socket_path}")
        request, response = messages()
        self._request = request
        self._list = self._channel.unary_unary(
            LIST_METHOD,
            request_serializer=request.SerializeToString,
            response_deserializer=response.FromString,
        )

    def list_devices(self, resource: str = GPU_RESOURCE) -> list[PodDevices]:
        try:
            answer = self._list(self._request(), timeout=self.timeout_s)
        except self._grpc.RpcError as exc:
            raise PodResourcesError(
                f"the kubelet's PodResources at {self.socket_path} did not answer: "
                f"{exc.code().name} {exc.details()}"
            ) from None
        out = []
        for pod in answer.pod_resources:
            ids = tuple(
                device_id
                for container in pod.containers
                for devices in container.devices
                if devices.resource_name == resource
                for device_id in devices.device_ids
            )
            if ids:
                out.append(PodDevices(namespace=pod.namespace, name=pod.name, device_ids=ids))
        return out

    def close(self) -> None:
        self._channel.close()


class PodGpuReader:
    """Each pod's GPUs as this node's indices, read at most every `max_age_s` (telemetry is
    asked for often; the kubelet need not be)."""

    def __init__(
        self,
        client: PodResourcesClient,
        uuids: dict[str, int],
        *,
        max_age_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.client, self.uuids, self.max_age_s, self.clock = client, uuids, max_age_s, clock
        self._lock = threading.Lock()
        self._read_at = -float("inf")
        self._last: tuple[list[PodGpus] | None, str | None] = (None, None)

    def read(self) -> tuple[list[PodGpus] | None, str | None]:
        """(pods, None), or (None, why) when the kubelet did not answer."""
        with self._lock:
            if self.clock() - self._read_at >= self.max_age_s:
                self._last = self._read()
                self._read_at = self.clock()
            return self._last

    def _read(self) -> tuple[list[PodGpus] | None, str | None]:
        try:
            pods = self.client.list_devices()
        except PodResourcesError as exc:
            return None, str(exc)
        out = []
        for pod in pods:
            indices = [self.index(d) for d in pod.device_ids]
            out.append(
                PodGpus(
                    namespace=pod.namespace,
                    name=pod.name,
                    gpus=sorted(i for i in indices if i is not None),
                    unknown_devices=[
                        d for d, i in zip(pod.device_ids, indices, strict=True) if i is None
                    ],
                )
            )
        return out, None

    def index(self, device_id: str) -> int | None:
        """A device plugin's id as this node's GPU index: a UUID, or an index itself."""
        if device_id in self.uuids:
            return self.uuids[device_id]
        if device_id.isdigit() and int(device_id) in self.uuids.values():
            return int(device_id)
        return None

    def close(self) -> None:
        self.client.close()
