# The warm pool's runtime image (deploy/warm-pool.yaml): an engine base image + Turnout's runtime agent.
#
#   docker build -f deploy/runtime.Dockerfile -t turnout-runtime:latest .
#   docker build -f deploy/runtime.Dockerfile --build-arg ENGINE_BASE=lmsysorg/sglang:v0.5.3-cu126 -t turnout-runtime:sglang .
#
# PID 1 is tini: it reaps engine processes that outlive a crashed agent and forwards the pod's SIGTERM to the
# restart loop (deploy/runtime-entrypoint.sh), which restarts the agent after a crash so that it re-adopts the
# engines that kept running. The base image brings the engine (vLLM by default) and its Python; EXTRA_PIP adds
# more pip requirements to the same Python, e.g. --build-arg EXTRA_PIP=kvcached; EXTRAS=gpu,llamacpp adds llama.cpp's
# own server (the xllamacpp wheel) for engine: llamacpp claims.
ARG ENGINE_BASE=vllm/vllm-openai:v0.11.0
FROM ${ENGINE_BASE}

ARG EXTRAS=gpu
ARG EXTRA_PIP=""
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends tini \
 && rm -rf /var/lib/apt/lists/*

WORKDIR /opt/turnout-src
COPY pyproject.toml README.md ./
COPY src ./src
RUN python3 -m pip install --no-cache-dir ".[${EXTRAS}]" ${EXTRA_PIP} \
 && rm -rf /opt/turnout-src
COPY deploy/runtime-entrypoint.sh /usr/local/bin/turnout-runtime
WORKDIR /

# The engine images ship their own ENTRYPOINT (vLLM's api_server): replace it.
ENTRYPOINT ["/usr/bin/tini", "-g", "--", "/usr/local/bin/turnout-runtime"]
CMD ["--port", "8080"]
