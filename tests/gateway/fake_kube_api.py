"""A Kubernetes API server for the pods only, on loopback: the list and watch answers of
`/api/v1/pods` and `/api/v1/namespaces/{ns}/pods` as the real one writes them (a `PodList`;
a watch as one JSON event per line), for the official client to talk to. There is no
Kubernetes API server on these machines; this is the part of one the job source uses.

The test sets the pods (`put`, `delete`), makes the server fail (`fail_with`) or answer
garbage (`garbage`), and reads what it was asked (`watches`, `tokens`).
"""

from __future__ import annotations

import asyncio
import copy
import json
import queue
import threading
import time
from pathlib import Path

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

TOKEN = "fake-cluster-token"


def pod(
    name: str,
    node: str,
    gpus: int,
    *,
    namespace: str = "ml",
    owner: str | None = None,
    annotations: dict[str, str] | None = None,
    phase: str = "Running",
    deadline_s: int | None = None,
    service_account: str = "trainer",
) -> dict:
    """A pod as the API server shows it (the fields the source reads, and what the client
    needs to build its objects)."""
    meta: dict = {
        "name": name,
        "namespace": namespace,
        "uid": f"uid-{namespace}-{name}",
        "annotations": annotations or {},
    }
    if owner is not None:
        meta["ownerReferences"] = [
            {
                "apiVersion": "kubeflow.org/v1",
                "kind": "PyTorchJob",
                "name": owner,
                "uid": f"uid-{owner}",
                "controller": True,
            }
        ]
    resources = {"limits": {"nvidia.com/gpu": str(gpus)}} if gpus else {}
    spec: dict = {
        "nodeName": node,
        "serviceAccountName": service_account,
        "containers": [{"name": "main", "image": "trainer:1", "resources": resources}],
    }
    if deadline_s is not None:
        spec["activeDeadlineSeconds"] = deadline_s
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - 5))
    return {"metadata": meta, "spec": spec, "status": {"phase": phase, "startTime": started}}


class FakeKubeApi:
    def __init__(self) -> None:
        self._pods: dict[tuple[str, str], dict] = {}
        self._version = 1
        self._lock = threading.Lock()
        self._watchers: list[queue.Queue[dict]] = []
        self.fail_with: int | None = None
        self.garbage = False
        self.watches = 0  #: watch requests opened
        self.tokens: set[str] = set()  #: the bearer tokens seen
        self.app = Starlette(
            routes=[
                Route("/api/v1/pods", self._pods_route),
                Route("/api/v1/namespaces/{namespace}/pods", self._pods_route),
            ]
        )

    # --- what the test does --------------------------------------------------------------

    def put(self, *pods: dict) -> None:
        for doc in pods:
            key = (doc["metadata"]["namespace"], doc["metadata"]["name"])
            self._change("MODIFIED" if key in self._pods else "ADDED", key, doc)

    def delete(self, namespace: str, name: str) -> None:
        self._change("DELETED", (namespace, name), None)

    def _change(self, kind: str, key: tuple[str, str], doc: dict | None) -> None:
        with self._lock:
            self._version += 1
            if doc is None:
                old = self._pods.pop(key)
            else:
                old = self._pods[key] = copy.deepcopy(doc)
            shown = self._shown(old)
            for watcher in self._watchers:
                watcher.put({"type": kind, "object": shown})

    def kubeconfig(self, url: str, folder: Path) -> Path:
        path = folder / "kubeconfig"
        path.write_text(
            json.dumps(  # JSON is YAML
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [{"name": "fake", "cluster": {"server": url}}],
                    "users": [{"name": "gateway", "user": {"token": TOKEN}}],
                    "contexts": [
                        {"name": "fake", "context": {"cluster": "fake", "user": "gateway"}}
                    ],
                    "current-context": "fake",
                }
            )
        )
        return path

    # --- what the server answers ---------------------------------------------------------

    def _shown(self, doc: dict) -> dict:
        shown = copy.deepcopy(doc)
        shown["apiVersion"], shown["kind"] = "v1", "Pod"
        shown["metadata"]["resourceVersion"] = str(self._version)
        return shown

    def _selected(self, request: Request) -> list[dict]:
        namespace = request.path_params.get("namespace")
        selector = request.query_params.get("fieldSelector", "")
        phase = selector.removeprefix("status.phase=") if selector else None
        return [
            self._shown(doc)
            for (ns, _), doc in sorted(self._pods.items())
            if (namespace is None or ns == namespace)
            and (phase is None or doc["status"]["phase"] == phase)
        ]

    async def _pods_route(self, request: Request) -> Response:
        self.tokens.add(request.headers.get("authorization", ""))
        if self.fail_with is not None:
            return JSONResponse(
                {"kind": "Status", "status": "Failure", "code": self.fail_with},
                status_code=self.fail_with,
            )
        if self.garbage:
            return PlainTextResponse("<html>upstream connect error</html>")
        if request.query_params.get("watch") in ("true", "1"):
            return self._watch(float(request.query_params.get("timeoutSeconds", "30")))
        with self._lock:
            items = self._selected(request)
            version = str(self._version)
        return JSONResponse(
            {
                "kind": "PodList",
                "apiVersion": "v1",
                "metadata": {"resourceVersion": version},
                "items": items,
            }
        )

    def _watch(self, timeout_s: float) -> StreamingResponse:
        events: queue.Queue[dict] = queue.Queue()
        with self._lock:
            self._watchers.append(events)
            self.watches += 1

        async def stream():
            deadline = time.monotonic() + timeout_s
            try:
                while time.monotonic() < deadline:
                    try:
                        event = events.get_nowait()
                    except queue.Empty:
                        await asyncio.sleep(0.05)
                        continue
                    yield json.dumps(event) + "\n"
            finally:
                with self._lock:
                    self._watchers.remove(events)

        return StreamingResponse(stream(), media_type="application/json")
