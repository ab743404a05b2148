# The warm pool's runtime image (deploy/warm-pool.yaml): a kvcached-enabled engine base image + Turnout's
# runtime agent.
#
#   docker build -f deploy/runtime.Dockerfile -t turnout-runtime:latest .
#   docker build -f deploy/runtime.Dockerfile --build-arg ENGINE_BASE=ghcr.io/ovg-project/kvcached-sglang:latest -t turnout-runtime:sglang .
#
# The pools design runs several engines on one GPU, sharing its memory through kvcached, so the default base is
# kvcached's own vLLM image (ovg-project/kvcached docker/Dockerfile.vllm: vLLM's image with kvcached installed,
# whose kvcached_autopatch.pth patches vLLM in every engine the agent starts with KVCACHED_AUTOPATCH=1);
# ghcr.io/ovg-project/kvcached-sglang is the SGLang one. On a base without kvcached the agent refuses to start a
# second vLLM or SGLang engine on a GPU (the engine is failed, its last_error says why) rather than let it fail
# for want of memory at every restart.
#
# PID 1 is tini: it reaps engine processes that outlive a crashed agent and forwards the pod's SIGTERM to the
# restart loop (deploy/runtime-entrypoint.sh), which restarts the agent after a crash so that it re-adopts the
# engines that kept running. The base image brings the engine (vLLM with kvcached by default) and its Python;
# EXTRA_PIP adds more pip requirements to the same Python; EXTRAS=gpu,s3,llamacpp adds llama.cpp's own server (the
# xllamacpp wheel) for engine: llamacpp claims.
ARG ENGINE_BASE=ghcr.io/ovg-project/kvcached-vllm:latest
FROM ${ENGINE_BASE}

# gpu: NVML (accelerators, the count of GPUs that engines share); s3: boto3, to download s3:// artifacts
ARG EXTRAS=gpu,s3
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

# The engine images ship their own ENTRYPOINT (vLLM's api_server; kvcached's images an empty one): replace it.
ENTRYPOINT ["/usr/bin/tini", "-g", "--", "/usr/local/bin/turnout-runtime"]
CMD ["--port", "8080"]
