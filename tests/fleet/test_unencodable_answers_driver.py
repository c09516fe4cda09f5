"""A provider's answer holding text no store can encode (a lone surrogate, what the JSON escape "\\ud800" decodes
to) is a provider failure, step by step with `FleetDriver` (issue #31, finding 2): the model is asked again within
the turn's retries, nothing of the bad answer is saved, and a turn that keeps failing is not a start that crashed
its worker. Before, the save failed with pydantic's error after the answer came, and the session was parked as
"model turn 1 was started 3 times without finishing" while the worker was alive."""

from __future__ import annotations

import redis

from lousho import Agent, Message
from lousho.errors import InvalidProviderAnswerError
from lousho.providers.base import ModelRequest, ModelResponse, RetryPolicy
from lousho.stores.redis import RedisStore
from lousho.testing import FleetDriver

FAST_RETRY = RetryPolicy(max_attempts=2, base_delay_s=0.001)
agent = Agent(name="chat", model="scripted", instructions="Answer.", retry=FAST_RETRY)


class Answers:
    """A vendor that answers from a list, then repeats its last answer; counts what it was asked."""

    def __init__(self, *texts: str) -> None:
        self.texts, self.asked = list(texts), 0

    async def generate(self, request: ModelRequest) -> ModelResponse:
        self.asked += 1
        return ModelResponse(message=Message.assistant(self.texts[min(self.asked, len(self.texts)) - 1]))


def test_an_answer_with_a_lone_surrogate_is_asked_again_and_the_good_answer_is_saved(
    redis_url: str, redis_prefix: str, redis_client: redis.Redis
) -> None:
    provider = Answers("bad \ud800 answer", "good answer")
    store = RedisStore(redis_client, prefix=redis_prefix)
    with FleetDriver(agents=[agent], redis_url=redis_url, store=store, provider=provider) as driver:
        driver.client.enqueue("chat", "hi", session_id="s")
        [turn] = driver.pending()

        assert driver.deliver(turn) == "finished"

        status = driver.client.status("s")
        assert (status.status, status.text, provider.asked) == ("finished", "good answer", 2)


def test_a_turn_whose_answers_cannot_be_stored_fails_as_a_provider_error_not_as_a_crashed_start(
    redis_url: str, redis_prefix: str, redis_client: redis.Redis
) -> None:
    provider = Answers("bad \ud800 answer")
    store = RedisStore(redis_client, prefix=redis_prefix)
    with FleetDriver(agents=[agent], redis_url=redis_url, store=store, provider=provider) as driver:
        driver.client.enqueue("chat", "hi", session_id="s")
        [turn] = driver.pending()
        before = driver.client.checkpoint("s")
        assert before is not None

        outcomes = [driver.deliver(turn) for _ in range(3)]  # the reaper's re-sends, each asking twice

        assert outcomes == [f"error: {InvalidProviderAnswerError.code}"] * 2 + ["parked"]
        assert provider.asked == 3 * FAST_RETRY.max_attempts
        status = driver.client.status("s")
        assert status.status == "parked" and status.parked_reason is not None
        assert "the provider failed model turn 1 3 times" in status.parked_reason
        assert "cannot be stored" in status.parked_reason and "without finishing" not in status.parked_reason
        after = driver.client.checkpoint("s")
        assert after is not None and after.messages == before.messages  # nothing of the answers was saved
