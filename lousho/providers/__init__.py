"""Model providers: the `LLMProvider` contract, the scripted test double, OpenAI and Anthropic.

Importing this package does not import the vendors' SDKs; a provider imports its SDK when made.
"""

from lousho.providers.anthropic import AnthropicProvider
from lousho.providers.base import LLMProvider, ModelRequest, ModelResponse, RetryPolicy, StreamingProvider, ToolSpec
from lousho.providers.openai import OpenAIProvider
from lousho.providers.scripted import ScriptedProvider, StreamingScriptedProvider, tool_calls

__all__ = [
    "AnthropicProvider",
    "LLMProvider",
    "ModelRequest",
    "ModelResponse",
    "OpenAIProvider",
    "RetryPolicy",
    "ScriptedProvider",
    "StreamingProvider",
    "StreamingScriptedProvider",
    "ToolSpec",
    "tool_calls",
]
