"""AIBrix's own runtime sidecar, in its mock mode, served over HTTP for Turnout's controllers to drive.

The runtime itself is AIBrix's published code (``aibrix`` 0.8.0 from PyPI): ``aibrix.runtime.model_runtime``'s
``ModelRuntime`` with its ``MockEngineLauncher`` and ``MockKVController``, exactly what
``AIBRIX_MODEL_RUNTIME_MOCK=1`` builds. Only the HTTP layer is re-stated here, because AIBrix serves it with
FastAPI, which its package pins to a version older than this project's (so the package is installed without
its dependencies). The routes follow ``aibrix/runtime/model_runtime_api.py`` line by line: each body is read
with AIBrix's request model (a body it refuses is a 422, as FastAPI answers), each answer is built with
AIBrix's response model, and runtime errors map to 400/404/409/500 as there.
"""

from __future__ import annotations

from typing import Any

from aibrix.openapi import protocol as aibrix  # type: ignore[import-untyped]
from aibrix.runtime.model_runtime import (  # type: ignore[import-untyped]
    MockEngineLauncher,
    MockKVController,
    ModelNotFoundError,
    ModelRuntime,
    UnsupportedModelControlError,
    instance_ready,
    read_kv_segment,
)
from aiohttp import web
from pydantic import BaseModel, ValidationError

__all__ = ["AIBRIX_RUNTIME", "REFUSED", "aibrix_runtime_app"]

AIBRIX_RUNTIME: web.AppKey[Any] = web.AppKey("aibrix_runtime")
REFUSED: web.AppKey[list[dict[str, Any]]] = web.AppKey("refused")


def aibrix_runtime_app(port_range: tuple[int, int]) -> web.Application:
    runtime = ModelRuntime(MockEngineLauncher(), port_range=port_range, kv_controller=MockKVController())
    refused: list[dict[str, Any]] = []  # bodies AIBrix's models refused (what a Turnout controller got wrong)

    def reply(model: BaseModel, status: int = 200) -> web.Response:
        return web.json_response(model.model_dump(mode="json"), status=status)

    async def read(request: web.Request, model: type[BaseModel]) -> Any:
        raw = await request.json()
        try:
            return model.model_validate(raw)
        except ValidationError as exc:
            refused.append({"path": request.path, "body": raw, "errors": exc.errors(include_url=False)})
            raise web.HTTPUnprocessableEntity(
                text=exc.json(include_url=False), content_type="application/json"
            ) from None

    def control_error(exc: Exception) -> web.Response:
        if isinstance(exc, ModelNotFoundError):
            return web.json_response({"detail": str(exc)}, status=404)
        if isinstance(exc, UnsupportedModelControlError):
            return web.json_response({"detail": str(exc)}, status=409)
        raise exc

    def operation(result: Any) -> web.Response:
        return reply(
            aibrix.RuntimeOperationResponse(
                model_name=result.model_name,
                operation_id=result.operation_id,
                applied=result.applied,
                phase=result.phase,
            )
        )

    async def activate(request: web.Request) -> web.Response:
        req = await read(request, aibrix.ActivateRuntimeModelRequest)
        try:
            inst = runtime.activate(
                model_name=req.model_name,
                artifact_url=req.artifact_url,
                engine=req.engine,
                port=req.port,
                ipc_name=req.ipc_name or "",
                engine_config=req.engine_config.model_dump(exclude_none=True) if req.engine_config else None,
                additional_config=req.additional_config,
                claim_ref=req.claim_ref.model_dump() if req.claim_ref is not None else None,
            )
        except ValueError as exc:
            body = aibrix.ActivateRuntimeModelResponse(status="error", model_name=req.model_name, message=str(exc))
            return reply(body, 400)
        except Exception as exc:
            body = aibrix.ActivateRuntimeModelResponse(status="error", model_name=req.model_name, message=str(exc))
            return reply(body, 500)
        return reply(
            aibrix.ActivateRuntimeModelResponse(
                status="success", model_name=inst.model_name, port=inst.port, ipc_name=inst.ipc_name
            )
        )

    async def deactivate(request: web.Request) -> web.Response:
        req = await read(request, aibrix.DeactivateRuntimeModelRequest)
        runtime.deactivate(req.model_name, mode=req.mode)
        return web.json_response({"status": "success"})

    async def kv_limit(request: web.Request) -> web.Response:
        req = await read(request, aibrix.SetRuntimeModelKVLimitRequest)
        try:
            return operation(runtime.set_kv_limit(req.model_name, req.limit_bytes, operation_id=req.operation_id))
        except Exception as exc:
            return control_error(exc)

    async def sleep(request: web.Request) -> web.Response:
        req = await read(request, aibrix.SleepRuntimeModelRequest)
        try:
            return operation(runtime.sleep(req.model_name, level=req.level, operation_id=req.operation_id))
        except Exception as exc:
            return control_error(exc)

    async def wake(request: web.Request) -> web.Response:
        req = await read(request, aibrix.WakeRuntimeModelRequest)
        try:
            return operation(runtime.wake(req.model_name, operation_id=req.operation_id))
        except Exception as exc:
            return control_error(exc)

    async def models(request: web.Request) -> web.Response:
        listed = []
        for m in runtime.list_models():
            seg = read_kv_segment(m.ipc_name)
            total, used, prealloc = seg if seg else (0, 0, 0)
            listed.append(
                aibrix.RuntimeModelInfo(
                    model_name=m.model_name,
                    port=m.port,
                    ipc_name=m.ipc_name,
                    phase=m.phase,
                    ready=instance_ready(m),
                    kv_used_bytes=used + prealloc,
                    kv_total_bytes=total,
                )
            )
        return reply(aibrix.ListRuntimeModelsResponse(models=listed))

    async def snapshot(request: web.Request) -> web.Response:
        return reply(aibrix.RuntimeSnapshotResponse(**runtime.snapshot()))

    app = web.Application()
    app[AIBRIX_RUNTIME] = runtime
    app[REFUSED] = refused
    r = app.router
    r.add_post("/v1/runtime/models/activate", activate)
    r.add_post("/v1/runtime/models/deactivate", deactivate)
    r.add_post("/v1/runtime/models/kv-limit", kv_limit)
    r.add_post("/v1/runtime/models/sleep", sleep)
    r.add_post("/v1/runtime/models/wake", wake)
    r.add_get("/v1/runtime/models", models)
    r.add_get("/v1/runtime/snapshot", snapshot)
    return app
