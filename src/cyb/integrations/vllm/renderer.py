"""The prompt of a pause model, laid out as training laid it out.

vLLM's renderer turns every prompt (text, token ids, chat messages) into the token ids the
engine runs; :class:`PauseRenderer` is vLLM's Hugging Face renderer that then puts ``M - 1``
pauses after every prompt token but the last (:meth:`ServedPauses.layout
<cyb.integrations.vllm.pauses.ServedPauses.layout>`), and refuses a prompt that holds pause
or dk ids.  The plugin selects it for pause models (tokenizer mode ``cyb``); the prompt's
length vLLM checks and counts (``usage.prompt_tokens``) is then that of the laid-out prompt.
"""

from __future__ import annotations

from vllm.renderers.hf import HfRenderer

from .readout import pauses_of


class PauseRenderer(HfRenderer):
    def __init__(self, config, tokenizer) -> None:
        super().__init__(config, tokenizer)
        self.pauses = pauses_of(config.model_config.hf_config)

    def _lay_out(self, engine_input):
        if self.pauses is not None and engine_input.get("type") == "token":
            from vllm.exceptions import VLLMValidationError

            try:
                engine_input["prompt_token_ids"] = self.pauses.layout(list(engine_input["prompt_token_ids"]))
            except ValueError as e:
                raise VLLMValidationError(str(e), parameter="prompt") from None
        return engine_input

    def _process_tokens(self, prompt, *, skip_mm_cache: bool = False):
        return self._lay_out(super()._process_tokens(prompt, skip_mm_cache=skip_mm_cache))

    async def _process_tokens_async(self, prompt, *, skip_mm_cache: bool = False):
        return self._lay_out(await super()._process_tokens_async(prompt, skip_mm_cache=skip_mm_cache))
