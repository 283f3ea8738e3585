from shardline.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RequestState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    REQUEST_STATE_UNSPECIFIED: _ClassVar[RequestState]
    REQUEST_STATE_QUEUED: _ClassVar[RequestState]
    REQUEST_STATE_RUNNING: _ClassVar[RequestState]
    REQUEST_STATE_FINISHED: _ClassVar[RequestState]
    REQUEST_STATE_CANCELLED: _ClassVar[RequestState]
    REQUEST_STATE_FAILED: _ClassVar[RequestState]
REQUEST_STATE_UNSPECIFIED: RequestState
REQUEST_STATE_QUEUED: RequestState
REQUEST_STATE_RUNNING: RequestState
REQUEST_STATE_FINISHED: RequestState
REQUEST_STATE_CANCELLED: RequestState
REQUEST_STATE_FAILED: RequestState

class TokenIds(_message.Message):
    __slots__ = ("ids",)
    IDS_FIELD_NUMBER: _ClassVar[int]
    ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, ids: _Optional[_Iterable[int]] = ...) -> None: ...

class Chat(_message.Message):
    __slots__ = ("messages",)
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[_common_pb2.ChatMessage]
    def __init__(self, messages: _Optional[_Iterable[_Union[_common_pb2.ChatMessage, _Mapping]]] = ...) -> None: ...

class GenerateRequest(_message.Message):
    __slots__ = ("model", "prompt_text", "prompt_token_ids", "chat", "max_tokens", "temperature", "top_k", "top_p", "seed", "stop", "stop_token_ids", "ignore_eos", "request_id")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TEXT_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    CHAT_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    STOP_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    IGNORE_EOS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    model: str
    prompt_text: str
    prompt_token_ids: TokenIds
    chat: Chat
    max_tokens: int
    temperature: float
    top_k: int
    top_p: float
    seed: int
    stop: _containers.RepeatedScalarFieldContainer[str]
    stop_token_ids: _containers.RepeatedScalarFieldContainer[int]
    ignore_eos: bool
    request_id: str
    def __init__(self, model: _Optional[str] = ..., prompt_text: _Optional[str] = ..., prompt_token_ids: _Optional[_Union[TokenIds, _Mapping]] = ..., chat: _Optional[_Union[Chat, _Mapping]] = ..., max_tokens: _Optional[int] = ..., temperature: _Optional[float] = ..., top_k: _Optional[int] = ..., top_p: _Optional[float] = ..., seed: _Optional[int] = ..., stop: _Optional[_Iterable[str]] = ..., stop_token_ids: _Optional[_Iterable[int]] = ..., ignore_eos: _Optional[bool] = ..., request_id: _Optional[str] = ...) -> None: ...

class GenerateResponse(_message.Message):
    __slots__ = ("request_id", "model", "text", "token_ids", "finish_reason", "matched_stop", "usage", "timings")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    MATCHED_STOP_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    TIMINGS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    model: str
    text: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    finish_reason: _common_pb2.FinishReason
    matched_stop: str
    usage: _common_pb2.Usage
    timings: _common_pb2.Timings
    def __init__(self, request_id: _Optional[str] = ..., model: _Optional[str] = ..., text: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ..., finish_reason: _Optional[_Union[_common_pb2.FinishReason, str]] = ..., matched_stop: _Optional[str] = ..., usage: _Optional[_Union[_common_pb2.Usage, _Mapping]] = ..., timings: _Optional[_Union[_common_pb2.Timings, _Mapping]] = ...) -> None: ...

class GenerateStreamResponse(_message.Message):
    __slots__ = ("request_id", "chunk", "complete", "error")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    COMPLETE_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    chunk: StreamChunk
    complete: StreamComplete
    error: StreamError
    def __init__(self, request_id: _Optional[str] = ..., chunk: _Optional[_Union[StreamChunk, _Mapping]] = ..., complete: _Optional[_Union[StreamComplete, _Mapping]] = ..., error: _Optional[_Union[StreamError, _Mapping]] = ...) -> None: ...

class StreamChunk(_message.Message):
    __slots__ = ("text", "token_ids")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    text: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, text: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class StreamComplete(_message.Message):
    __slots__ = ("finish_reason", "matched_stop", "usage", "timings")
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    MATCHED_STOP_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    TIMINGS_FIELD_NUMBER: _ClassVar[int]
    finish_reason: _common_pb2.FinishReason
    matched_stop: str
    usage: _common_pb2.Usage
    timings: _common_pb2.Timings
    def __init__(self, finish_reason: _Optional[_Union[_common_pb2.FinishReason, str]] = ..., matched_stop: _Optional[str] = ..., usage: _Optional[_Union[_common_pb2.Usage, _Mapping]] = ..., timings: _Optional[_Union[_common_pb2.Timings, _Mapping]] = ...) -> None: ...

class StreamError(_message.Message):
    __slots__ = ("code", "message")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    code: str
    message: str
    def __init__(self, code: _Optional[str] = ..., message: _Optional[str] = ...) -> None: ...

class CancelRequest(_message.Message):
    __slots__ = ("request_id",)
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    def __init__(self, request_id: _Optional[str] = ...) -> None: ...

class CancelResponse(_message.Message):
    __slots__ = ("cancelled", "state")
    CANCELLED_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    cancelled: bool
    state: RequestState
    def __init__(self, cancelled: _Optional[bool] = ..., state: _Optional[_Union[RequestState, str]] = ...) -> None: ...

class GetRequestRequest(_message.Message):
    __slots__ = ("request_id",)
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    def __init__(self, request_id: _Optional[str] = ...) -> None: ...

class RequestStatus(_message.Message):
    __slots__ = ("request_id", "model", "state", "route", "num_prompt_tokens", "num_generated_tokens", "num_resumes", "queued_at", "first_token_at", "finished_at", "finish_reason", "error")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    ROUTE_FIELD_NUMBER: _ClassVar[int]
    NUM_PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    NUM_GENERATED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    NUM_RESUMES_FIELD_NUMBER: _ClassVar[int]
    QUEUED_AT_FIELD_NUMBER: _ClassVar[int]
    FIRST_TOKEN_AT_FIELD_NUMBER: _ClassVar[int]
    FINISHED_AT_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    model: str
    state: RequestState
    route: _containers.RepeatedScalarFieldContainer[str]
    num_prompt_tokens: int
    num_generated_tokens: int
    num_resumes: int
    queued_at: float
    first_token_at: float
    finished_at: float
    finish_reason: _common_pb2.FinishReason
    error: str
    def __init__(self, request_id: _Optional[str] = ..., model: _Optional[str] = ..., state: _Optional[_Union[RequestState, str]] = ..., route: _Optional[_Iterable[str]] = ..., num_prompt_tokens: _Optional[int] = ..., num_generated_tokens: _Optional[int] = ..., num_resumes: _Optional[int] = ..., queued_at: _Optional[float] = ..., first_token_at: _Optional[float] = ..., finished_at: _Optional[float] = ..., finish_reason: _Optional[_Union[_common_pb2.FinishReason, str]] = ..., error: _Optional[str] = ...) -> None: ...

class ListModelsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ModelInfo(_message.Message):
    __slots__ = ("name", "architecture", "max_model_len", "num_stages", "tp_size", "num_routes")
    NAME_FIELD_NUMBER: _ClassVar[int]
    ARCHITECTURE_FIELD_NUMBER: _ClassVar[int]
    MAX_MODEL_LEN_FIELD_NUMBER: _ClassVar[int]
    NUM_STAGES_FIELD_NUMBER: _ClassVar[int]
    TP_SIZE_FIELD_NUMBER: _ClassVar[int]
    NUM_ROUTES_FIELD_NUMBER: _ClassVar[int]
    name: str
    architecture: str
    max_model_len: int
    num_stages: int
    tp_size: int
    num_routes: int
    def __init__(self, name: _Optional[str] = ..., architecture: _Optional[str] = ..., max_model_len: _Optional[int] = ..., num_stages: _Optional[int] = ..., tp_size: _Optional[int] = ..., num_routes: _Optional[int] = ...) -> None: ...

class ListModelsResponse(_message.Message):
    __slots__ = ("models",)
    MODELS_FIELD_NUMBER: _ClassVar[int]
    models: _containers.RepeatedCompositeFieldContainer[ModelInfo]
    def __init__(self, models: _Optional[_Iterable[_Union[ModelInfo, _Mapping]]] = ...) -> None: ...
