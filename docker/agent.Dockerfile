# The agent alone, for a GPU node (deploy/kubernetes/agent-daemonset.yaml): `flexgate[agent]`,
# the agent-only install, with none of the gateway's dependencies (grid protocols, store,
# Kubernetes client, plots). `--build-arg EXTRA=agent-kubernetes` adds the kubelet's
# PodResources client (gRPC) for a node that runs Kubernetes jobs. Built from the repository's
# root: `docker build -f docker/agent.Dockerfile -t flexgate-agent .` (on the official
# python:3.11-slim, or the one scripts/local-base-image.sh makes where no registry answers).
FROM python:3.11-slim AS build
# The same first steps as the Dockerfile's, so the two builds share these layers: a CA bundle
# for a TLS-intercepting network, read in this stage only (docker/build-ca/README.md).
COPY docker/build-ca/ /tmp/build-ca/
RUN if [ -f /tmp/build-ca/ca-certificates.crt ]; then \
        printf '[global]\ncert = /tmp/build-ca/ca-certificates.crt\n' >/etc/pip.conf; fi \
    && python -m venv /opt/flexgate
ENV PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md ./
ARG EXTRA=agent
# The dependencies first, in their own layer: a change to flexgate's code rebuilds in seconds.
# With no source copied yet, `.[EXTRA]` is flexgate without its code: pip resolves the extra
# (and the extras it names) as `pip install 'flexgate[agent]'` does on a node.
RUN /opt/flexgate/bin/pip install --no-cache-dir "./[${EXTRA}]"
COPY flexmodel flexmodel
COPY agents agents
COPY gateway gateway
COPY flexgate flexgate
RUN /opt/flexgate/bin/pip install --no-cache-dir --no-deps --force-reinstall . \
    && rm -rf /src/build

FROM python:3.11-slim
# Root inside the container is what NVML's power-limit setter needs on a GPU node (the
# DaemonSet runs it as 0 with CAP_SYS_ADMIN alone); by default it runs as an ordinary user.
RUN useradd --create-home --uid 10001 flexgate \
    && mkdir -p /var/lib/flexgate-agent && chown flexgate /var/lib/flexgate-agent
COPY --from=build /opt/flexgate /opt/flexgate
ENV PATH=/opt/flexgate/bin:$PATH \
    FLEXGATE_AGENT_HOST=0.0.0.0 \
    FLEXGATE_AGENT_STATE_DIR=/var/lib/flexgate-agent
# The original limits: keep them on the host (a volume), so a replaced container restores them.
VOLUME ["/var/lib/flexgate-agent"]
EXPOSE 9100
USER flexgate
HEALTHCHECK --interval=10s --timeout=3s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:9100/health', timeout=2)"]
ENTRYPOINT ["flexgate"]
CMD ["agent", "--backend", "nvml"]
