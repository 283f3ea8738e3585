"""The gateway's shared detokenize stream against the real tokenizer service: concurrent requests'
items share messages, every sequence gets exactly its own text, and a sequence whose stream broke
fails instead of going on without its state."""

from __future__ import annotations

import asyncio

import pytest

from shardline.gateway.errors import Unavailable
from shardline.gateway.tokenizer_client import TokenizerClient
from shardline.v1 import tokenizer_pb2

TEXTS = ["Hello, world!", "안녕하세요 🙂 friends", "stop here STOP and not this", "a b c d e f g"]


def test_concurrent_sequences_share_messages_and_each_gets_its_own_text(loop_thread, tokenizer_service):
    address, service = tokenizer_service

    async def run():
        client = TokenizerClient(address)

        async def one(text: str, stop: list[str]) -> tuple[str, str]:
            ids = service.encode(text, add_special_tokens=False)
            detok = client.detokenizer(stop, [])
            out, matched = [], ""
            for i in ids:  # a token at a time, as a decode step sends them
                r = await detok.push([i])
                out.append(r.text)
                if r.finished:
                    matched = r.matched_stop
                    break
            flush = await detok.finish()
            if flush is not None:
                out.append(flush.text)
            detok.close()
            return "".join(out), matched

        jobs = [one(text, ["STOP"]) for text in TEXTS for _ in range(8)]
        results = await asyncio.gather(*jobs)
        stats = client._mux.num_messages, client._mux.num_items
        await client.close()
        return results, stats

    results, (messages, items) = loop_thread.run(run())
    for (text, matched), want in zip(results, [t for t in TEXTS for _ in range(8)]):
        if "STOP" in want:
            assert (text, matched) == (want[:want.index("STOP")], "STOP")
        else:
            assert (text, matched) == (service.decode(service.encode(want, add_special_tokens=False)), "")
    assert messages < items / 4, f"{messages} messages for {items} items: 32 sequences did not share them"


def test_a_sequence_from_a_broken_stream_fails_and_new_ones_work(loop_thread, tokenizer_service):
    address, service = tokenizer_service
    ids = service.encode("Hello, world!", add_special_tokens=False)

    async def run():
        client = TokenizerClient(address)
        old = client.detokenizer([], [])
        await old.push(ids[:1])
        client._mux._end_stream()  # what a tokenizer restart or a timed-out message does
        with pytest.raises(Unavailable, match="text state went with it"):
            await old.push(ids[1:2])
        new = client.detokenizer([], [])
        text = (await new.push(ids)).text + (await new.finish()).text
        await client.close()
        return text

    assert loop_thread.run(run()) == service.decode(ids)


def test_an_item_queued_as_its_stream_broke_fails_with_it(loop_thread, tokenizer_service):
    """An item handed in before the break but sent after it would reach the new stream without its
    sequence's state: it fails instead, and the new stream starts clean."""
    address, service = tokenizer_service
    ids = service.encode("Hello, world!", add_special_tokens=False)

    async def run():
        client = TokenizerClient(address)
        mux = client._mux
        old = client.detokenizer(["world"], [])
        await old.push(ids[:1])
        epoch, sequence = old._sequence
        late = mux.exchange(tokenizer_pb2.DetokenizeItem(
            sequence=sequence, request=tokenizer_pb2.DetokenizeRequest(token_ids=ids[1:2])), epoch)
        mux._end_stream()  # the break, before the sender took the item
        with pytest.raises(Unavailable, match="text state went with it"):
            await late
        new = client.detokenizer([], [])
        text = (await new.push(ids)).text + (await new.finish()).text
        await client.close()
        return text

    assert loop_thread.run(run()) == service.decode(ids)
