from shardline.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class AdmitRequest(_message.Message):
    __slots__ = ("request_id", "prompt_token_ids", "sampling", "route", "generated_token_ids")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    ROUTE_FIELD_NUMBER: _ClassVar[int]
    GENERATED_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    prompt_token_ids: _containers.RepeatedScalarFieldContainer[int]
    sampling: _common_pb2.SamplingParams
    route: _containers.RepeatedScalarFieldContainer[str]
    generated_token_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, request_id: _Optional[str] = ..., prompt_token_ids: _Optional[_Iterable[int]] = ..., sampling: _Optional[_Union[_common_pb2.SamplingParams, _Mapping]] = ..., route: _Optional[_Iterable[str]] = ..., generated_token_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class AdmitItem(_message.Message):
    __slots__ = ("sequence", "admit", "cancel")
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    ADMIT_FIELD_NUMBER: _ClassVar[int]
    CANCEL_FIELD_NUMBER: _ClassVar[int]
    sequence: int
    admit: AdmitRequest
    cancel: bool
    def __init__(self, sequence: _Optional[int] = ..., admit: _Optional[_Union[AdmitRequest, _Mapping]] = ..., cancel: _Optional[bool] = ...) -> None: ...

class GenerateManyRequest(_message.Message):
    __slots__ = ("items",)
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[AdmitItem]
    def __init__(self, items: _Optional[_Iterable[_Union[AdmitItem, _Mapping]]] = ...) -> None: ...

class TokenItem(_message.Message):
    __slots__ = ("sequence", "event", "code", "message")
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    EVENT_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    sequence: int
    event: TokenEvent
    code: int
    message: str
    def __init__(self, sequence: _Optional[int] = ..., event: _Optional[_Union[TokenEvent, _Mapping]] = ..., code: _Optional[int] = ..., message: _Optional[str] = ...) -> None: ...

class GenerateManyResponse(_message.Message):
    __slots__ = ("items",)
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[TokenItem]
    def __init__(self, items: _Optional[_Iterable[_Union[TokenItem, _Mapping]]] = ...) -> None: ...

class TokenEvent(_message.Message):
    __slots__ = ("request_id", "token_id", "index", "finish_reason", "error")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    token_id: int
    index: int
    finish_reason: _common_pb2.FinishReason
    error: str
    def __init__(self, request_id: _Optional[str] = ..., token_id: _Optional[int] = ..., index: _Optional[int] = ..., finish_reason: _Optional[_Union[_common_pb2.FinishReason, str]] = ..., error: _Optional[str] = ...) -> None: ...

class SequenceChunk(_message.Message):
    __slots__ = ("request_id", "start_position", "num_tokens", "sample", "sampling")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    START_POSITION_FIELD_NUMBER: _ClassVar[int]
    NUM_TOKENS_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    start_position: int
    num_tokens: int
    sample: bool
    sampling: _common_pb2.SamplingParams
    def __init__(self, request_id: _Optional[str] = ..., start_position: _Optional[int] = ..., num_tokens: _Optional[int] = ..., sample: _Optional[bool] = ..., sampling: _Optional[_Union[_common_pb2.SamplingParams, _Mapping]] = ...) -> None: ...

class MicroBatch(_message.Message):
    __slots__ = ("micro_batch_id", "origin", "route", "sequences", "hidden", "free_request_ids")
    MICRO_BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    ORIGIN_FIELD_NUMBER: _ClassVar[int]
    ROUTE_FIELD_NUMBER: _ClassVar[int]
    SEQUENCES_FIELD_NUMBER: _ClassVar[int]
    HIDDEN_FIELD_NUMBER: _ClassVar[int]
    FREE_REQUEST_IDS_FIELD_NUMBER: _ClassVar[int]
    micro_batch_id: int
    origin: str
    route: _containers.RepeatedScalarFieldContainer[str]
    sequences: _containers.RepeatedCompositeFieldContainer[SequenceChunk]
    hidden: _common_pb2.Tensor
    free_request_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, micro_batch_id: _Optional[int] = ..., origin: _Optional[str] = ..., route: _Optional[_Iterable[str]] = ..., sequences: _Optional[_Iterable[_Union[SequenceChunk, _Mapping]]] = ..., hidden: _Optional[_Union[_common_pb2.Tensor, _Mapping]] = ..., free_request_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class ForwardAck(_message.Message):
    __slots__ = ("num_queued_micro_batches",)
    NUM_QUEUED_MICRO_BATCHES_FIELD_NUMBER: _ClassVar[int]
    num_queued_micro_batches: int
    def __init__(self, num_queued_micro_batches: _Optional[int] = ...) -> None: ...

class SampledToken(_message.Message):
    __slots__ = ("request_id", "token_id")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    token_id: int
    def __init__(self, request_id: _Optional[str] = ..., token_id: _Optional[int] = ...) -> None: ...

class SampledTokens(_message.Message):
    __slots__ = ("micro_batch_id", "tokens", "error")
    MICRO_BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    micro_batch_id: int
    tokens: _containers.RepeatedCompositeFieldContainer[SampledToken]
    error: str
    def __init__(self, micro_batch_id: _Optional[int] = ..., tokens: _Optional[_Iterable[_Union[SampledToken, _Mapping]]] = ..., error: _Optional[str] = ...) -> None: ...

class Ack(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class FreeRequest(_message.Message):
    __slots__ = ("request_ids", "route")
    REQUEST_IDS_FIELD_NUMBER: _ClassVar[int]
    ROUTE_FIELD_NUMBER: _ClassVar[int]
    request_ids: _containers.RepeatedScalarFieldContainer[str]
    route: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, request_ids: _Optional[_Iterable[str]] = ..., route: _Optional[_Iterable[str]] = ...) -> None: ...

class StatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class StageCounters(_message.Message):
    __slots__ = ("num_steps", "num_tokens", "busy_seconds", "max_micro_batches_in_flight")
    NUM_STEPS_FIELD_NUMBER: _ClassVar[int]
    NUM_TOKENS_FIELD_NUMBER: _ClassVar[int]
    BUSY_SECONDS_FIELD_NUMBER: _ClassVar[int]
    MAX_MICRO_BATCHES_IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    num_steps: int
    num_tokens: int
    busy_seconds: float
    max_micro_batches_in_flight: int
    def __init__(self, num_steps: _Optional[int] = ..., num_tokens: _Optional[int] = ..., busy_seconds: _Optional[float] = ..., max_micro_batches_in_flight: _Optional[int] = ...) -> None: ...

class StageStatus(_message.Message):
    __slots__ = ("stage_index", "num_stages", "layer_start", "layer_end", "tp_size", "replica_id", "address", "model", "num_total_blocks", "num_free_blocks", "block_size", "running_request_ids", "counters", "is_draining")
    STAGE_INDEX_FIELD_NUMBER: _ClassVar[int]
    NUM_STAGES_FIELD_NUMBER: _ClassVar[int]
    LAYER_START_FIELD_NUMBER: _ClassVar[int]
    LAYER_END_FIELD_NUMBER: _ClassVar[int]
    TP_SIZE_FIELD_NUMBER: _ClassVar[int]
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    NUM_TOTAL_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    NUM_FREE_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    BLOCK_SIZE_FIELD_NUMBER: _ClassVar[int]
    RUNNING_REQUEST_IDS_FIELD_NUMBER: _ClassVar[int]
    COUNTERS_FIELD_NUMBER: _ClassVar[int]
    IS_DRAINING_FIELD_NUMBER: _ClassVar[int]
    stage_index: int
    num_stages: int
    layer_start: int
    layer_end: int
    tp_size: int
    replica_id: str
    address: str
    model: str
    num_total_blocks: int
    num_free_blocks: int
    block_size: int
    running_request_ids: _containers.RepeatedScalarFieldContainer[str]
    counters: StageCounters
    is_draining: bool
    def __init__(self, stage_index: _Optional[int] = ..., num_stages: _Optional[int] = ..., layer_start: _Optional[int] = ..., layer_end: _Optional[int] = ..., tp_size: _Optional[int] = ..., replica_id: _Optional[str] = ..., address: _Optional[str] = ..., model: _Optional[str] = ..., num_total_blocks: _Optional[int] = ..., num_free_blocks: _Optional[int] = ..., block_size: _Optional[int] = ..., running_request_ids: _Optional[_Iterable[str]] = ..., counters: _Optional[_Union[StageCounters, _Mapping]] = ..., is_draining: _Optional[bool] = ...) -> None: ...
