# One image for every flexgate service (docker-compose.yml): gateway, agent, mock VTN. It builds
# on the official python:3.11-slim, or on the one scripts/local-base-image.sh makes where no
# registry answers (docs/operations.md).
FROM python:3.11-slim AS build
# A CA bundle for a TLS-intercepting network, when docker/build-ca/ holds one: pip reads it in
# this stage only, which is not part of the image.
COPY docker/build-ca/ /tmp/build-ca/
RUN if [ -f /tmp/build-ca/ca-certificates.crt ]; then \
        printf '[global]\ncert = /tmp/build-ca/ca-certificates.crt\n' >/etc/pip.conf; fi \
    && python -m venv /opt/flexgate
ENV PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md ./
# The dependencies first, in their own layer: a change to flexgate's code rebuilds in seconds.
# Every role's (one image serves them all): the base and each extra's, less its references to
# other extras.
RUN python -c "import tomllib; p = tomllib.load(open('pyproject.toml', 'rb'))['project']; \
        extras = [r for k in ('agent', 'agent-kubernetes', 'gateway', 'lab') \
                  for r in p['optional-dependencies'][k] if not r.startswith('flexgate[')]; \
        print('\n'.join(p['dependencies'] + extras))" >requirements.txt \
    && /opt/flexgate/bin/pip install --no-cache-dir -r requirements.txt
COPY flexmodel flexmodel
COPY agents agents
COPY gateway gateway
COPY flexgate flexgate
RUN /opt/flexgate/bin/pip install --no-cache-dir --no-deps . && rm -rf /src/build

FROM python:3.11-slim
RUN useradd --create-home --uid 10001 flexgate && mkdir /data && chown flexgate /data
COPY --from=build /opt/flexgate /opt/flexgate
COPY examples /app/examples
ENV PATH=/opt/flexgate/bin:$PATH
WORKDIR /app
USER flexgate
ENTRYPOINT ["flexgate"]
