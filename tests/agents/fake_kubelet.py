"""A kubelet's PodResources service (v1 `List`) on a unix socket, answering with the pods the
test sets: there is no kubelet on these machines. It speaks gRPC with grpcio, as the kubelet
does, with the messages of `agents.podresources`."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import grpc

from agents.podresources import messages


class FakePodResources:
    def __init__(self, socket_path: str) -> None:
        self.socket_path = socket_path
        #: (namespace, pod, {resource: [device ids]} per container)
        self.pods: list[tuple[str, str, list[dict[str, list[str]]]]] = []
        self.calls = 0
        request, response = messages()
        self._response = response
        handler = grpc.method_handlers_generic_handler(
            "v1.PodResourcesLister",
            {
                "List": grpc.unary_unary_rpc_method_handler(
                    self._list,
                    request_deserializer=request.FromString,
                    response_serializer=response.SerializeToString,
                )
            },
        )
        self._server = grpc.server(ThreadPoolExecutor(max_workers=2))
        self._server.add_generic_rpc_handlers((handler,))
        self._server.add_insecure_port(f"unix://{socket_path}")

    def _list(self, _request, _context):
        self.calls += 1
        answer = self._response()
        for namespace, name, containers in self.pods:
            pod = answer.pod_resources.add(namespace=namespace, name=name)
            for i, devices in enumerate(containers):
                container = pod.containers.add(name=f"c{i}")
                for resource, ids in devices.items():
                    container.devices.add(resource_name=resource, device_ids=ids)
        return answer

    def __enter__(self) -> FakePodResources:
        self._server.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._server.stop(grace=None).wait()
