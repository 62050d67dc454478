# One image for every flexgate service (docker-compose.yml): gateway, agent, mock VTN.
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY flexmodel flexmodel
COPY agents agents
COPY gateway gateway
COPY flexgate flexgate
COPY examples examples
RUN pip install --no-cache-dir . && useradd --create-home flexgate && mkdir /data \
    && chown flexgate /data
USER flexgate
ENTRYPOINT ["flexgate"]
