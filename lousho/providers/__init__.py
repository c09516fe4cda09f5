"""Model providers: the `LLMProvider` contract and the scripted test double."""

from lousho.providers.base import LLMProvider, ModelRequest, ModelResponse, ToolSpec
from lousho.providers.scripted import ScriptedProvider, tool_calls

__all__ = ["LLMProvider", "ModelRequest", "ModelResponse", "ScriptedProvider", "ToolSpec", "tool_calls"]
