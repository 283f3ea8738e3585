"""The gateway: shardline's public front door. Stateless; what must survive it lives in Redis.

Where things happen:
- server.py       the gRPC servicer (wire <-> Gateway), health, reflection; serve(config)
- http.py         the OpenAI-compatible HTTP front door (same Gateway underneath)
- service.py      Gateway: submit / cancel / get_request / list_models, registry watch
- generation.py   one request: queue -> route -> stage-0 stream -> detokenize -> deltas, failover
- validation.py   field ranges and context fit (INVALID_ARGUMENT / OUT_OF_RANGE)
- admission.py    the bounded queue (RESOURCE_EXHAUSTED with a retry hint)
- routing.py      route choice from the replica registry, least loaded first
- stage_client.py one GenerateMany stream a stage-0 replica, shared by the requests routed there
- tokenizer_client.py  the tokenizer service; one DetokenizeMany stream the requests share
- gathering.py    one send a batch of what many requests hand in (Redis writes, stream items)
- records.py      request records in Redis
- cli.py          `python -m shardline.gateway`
"""
