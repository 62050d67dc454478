"""A stand-in for dcgm-exporter on loopback: it serves Prometheus text at `/metrics` with the
rows the test sets (DCGM's names and labels: `gpu`, `UUID`, `device`, `modelName`,
`Hostname`), or fails as told. Used where DCGM itself cannot run (no GPU here)."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class FakeDcgmExporter:
    def __init__(self) -> None:
        #: GPU index -> (UUID, DRAM activity 0-1); the UUID may be "" (no label)
        self.dram: dict[int, tuple[str, float]] = {}
        self.extra = ""  #: more lines served as they are (MIG rows, other fields)
        self.status = 200
        self.scrapes = 0
        exporter = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                exporter.scrapes += 1
                body = exporter.text().encode()
                self.send_response(exporter.status)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_: object) -> None:
                return None

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/metrics"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def text(self) -> str:
        lines = [
            "# HELP DCGM_FI_DEV_SM_CLOCK SM clock frequency (in MHz).",
            "# TYPE DCGM_FI_DEV_SM_CLOCK gauge",
            *(
                f'DCGM_FI_DEV_SM_CLOCK{{gpu="{i}",UUID="{u}",device="nvidia{i}"}} 1980'
                for i, (u, _) in sorted(self.dram.items())
            ),
            "# HELP DCGM_FI_PROF_DRAM_ACTIVE Ratio of cycles the device memory interface is "
            "active sending or receiving data.",
            "# TYPE DCGM_FI_PROF_DRAM_ACTIVE gauge",
        ]
        for i, (uuid, value) in sorted(self.dram.items()):
            labels = f'gpu="{i}",' + (f'UUID="{uuid}",' if uuid else "")
            labels += f'device="nvidia{i}",modelName="NVIDIA H200",Hostname="node-01"'
            lines.append(f"DCGM_FI_PROF_DRAM_ACTIVE{{{labels}}} {value:.6f}")
        return "\n".join(lines) + "\n" + self.extra

    def __enter__(self) -> FakeDcgmExporter:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()

    def stop(self) -> None:
        if self._thread.is_alive():  # shutdown() waits for serve_forever, so only if it runs
            self._server.shutdown()
        self._server.server_close()
