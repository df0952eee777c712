"""Our own generation loop over upstream's talker and code predictor.

Upstream's `Qwen3TTSForConditionalGeneration.generate` runs transformers' `generate` on the
talker, whose every step runs transformers' `generate` again on the code predictor for the
frame's 15 other codebooks: each frame rebuilds generation configs, logits-processor lists and
caches, and goes through the model-level forwards (masks, cache bookkeeping) 16 times. Here
the same modules are driven directly:

- The prompt is upstream's own: its `generate` is called on a stand-in whose talker's
  `generate` hands back its arguments (the prompt's embeddings, the trailing text, the
  sampling options) instead of generating, so every prompt shape is built by upstream's code.
- The sampling is transformers' own: its logits processors, built once a stream from the
  options upstream passes (temperature, top-k, top-p, repetition penalty, suppressed tokens,
  the minimum of 2 tokens before EOS; the code predictor's `subtalker_*`), then softmax and
  `torch.multinomial` or argmax, as `GenerationMixin._sample` does.
- The layers are upstream's decoder layers, called with a cache whose keys and values sit in
  buffers allocated once a stream (`_Cache`), the code predictor's emptied each frame, and the
  rotary tables of the code predictor's 15 sub-steps computed once a stream.

The arithmetic is the same operations on the same shapes as upstream's run (the cache hands
back the filled part, as transformers' DynamicCache does; the heads run over every position
where upstream's do), so greedy codes equal upstream's frame for frame. The random draws are
taken in upstream's order: one `torch.multinomial` for the prefill's token, then for each
frame 15 for the code predictor and one for the talker's next token, each over a row of the
same vocabulary as upstream's; so the same generator state gives the same codes. A stream
draws from its own `torch.Generator` (`seed=` or `generator=`), or from torch's global one as
upstream does when neither is given.

`Batch` steps many streams of one model together: one talker forward and 15 code-predictor
forwards a frame with a row per stream, whatever each stream's age (`_RowsCache`: a talker
cache row per stream at its own length, masked past it); each stream's codes are its solo
run's (tests/talker/test_batch.py).

Written against transformers 4.57.3 (the private `GenerationMixin` helpers that build the
processors) and qwen-tts 0.1.1; tests/talker/test_loop.py checks it against upstream.
"""

import torch
from transformers.generation.configuration_utils import GenerationMode
from transformers.generation.logits_process import LogitsProcessorList
from transformers.generation.stopping_criteria import (EosTokenCriteria, MaxLengthCriteria,
                                                       StoppingCriteriaList)

# Initial room for generated positions in a stream's talker cache; it doubles when outgrown.
_TALKER_ROOM = 256


class _Prompt(Exception):
    """Raised by the stand-in talker's `generate` with the arguments upstream built."""

    def __init__(self, arguments):
        super().__init__("prompt built")
        self.arguments = arguments


class _PromptOnlyTalker:
    """The talker as upstream's `generate` sees it, except that `generate` returns its inputs."""

    def __init__(self, talker):
        self._talker = talker

    def __getattr__(self, name):
        return getattr(self._talker, name)

    def generate(self, **arguments):
        raise _Prompt(arguments)


class _PromptOnlyModel:
    def __init__(self, model):
        self._model = model
        self.talker = _PromptOnlyTalker(model.talker)

    def __getattr__(self, name):
        return getattr(self._model, name)


def upstream_prompt(model, *, input_ids, instruct_ids=None, ref_ids=None,
                    voice_clone_prompt=None, language="auto", speaker=None,
                    non_streaming_mode=False, **gen):
    """The arguments upstream's `generate` passes to the talker's `generate` for one
    utterance: `inputs_embeds`, `attention_mask`, `trailing_text_hidden`, `tts_pad_embed`,
    and the sampling options (`subtalker_*` for the code predictor)."""
    try:
        type(model).generate(
            _PromptOnlyModel(model), input_ids=[input_ids],
            instruct_ids=None if instruct_ids is None else [instruct_ids],
            ref_ids=None if ref_ids is None else [ref_ids],
            voice_clone_prompt=voice_clone_prompt, languages=[language], speakers=[speaker],
            non_streaming_mode=non_streaming_mode, **gen)
    except _Prompt as prompt:
        return prompt.arguments
    raise RuntimeError("upstream's generate returned without calling the talker's generate")


class _Sampler:
    """A token from a step's logits as transformers' `generate` picks it on `module`."""

    def __init__(self, module, options, inputs_embeds, has_attention_mask, generator):
        config, unused = module._prepare_generation_config(None, **options)
        if unused:
            raise ValueError(f"options that are not generation options: {sorted(unused)}")
        device = inputs_embeds.device
        module._prepare_special_tokens(config, has_attention_mask, device=device)
        config = module._prepare_generated_length(
            generation_config=config, has_default_max_length="max_length" not in options,
            has_default_min_length="min_length" not in options, model_input_name="inputs_embeds",
            input_ids_length=0, inputs_tensor=inputs_embeds)
        mode = config.get_generation_mode()
        if mode not in (GenerationMode.GREEDY_SEARCH, GenerationMode.SAMPLE):
            raise ValueError(f"only greedy search and sampling, not {mode}")
        criteria = module._get_stopping_criteria(
            generation_config=config, stopping_criteria=StoppingCriteriaList(), tokenizer=None)
        other = [type(c).__name__ for c in criteria
                 if not isinstance(c, (MaxLengthCriteria, EosTokenCriteria))]
        if other:
            raise ValueError(f"stopping criteria other than length and EOS: {other}")
        # Called one by one: LogitsProcessorList inspects each one's signature every call.
        self.processors = list(module._get_logits_processor(
            generation_config=config, input_ids_seq_length=0, encoder_input_ids=inputs_embeds,
            prefix_allowed_tokens_fn=None, logits_processor=LogitsProcessorList(), device=device,
            model_kwargs={}))
        self.do_sample = config.do_sample
        self.max_length = config.max_length
        eos = config._eos_token_tensor
        self.eos = frozenset() if eos is None else frozenset(eos.tolist())
        self.generator = generator

    def __call__(self, ids, logits):
        """`ids` [1, n]: the tokens made so far; `logits` [1, positions, vocab]. Returns [1]."""
        scores = logits[:, -1, :].to(copy=True, dtype=torch.float32)
        for processor in self.processors:
            scores = processor(ids, scores)
        if self.do_sample:
            probs = torch.nn.functional.softmax(scores, dim=-1)
            return torch.multinomial(probs, num_samples=1, generator=self.generator).squeeze(1)
        return torch.argmax(scores, dim=-1)


class _Cache:
    """Every layer's keys and values for one stream in buffers allocated once (grown by doubling
    if a stream outlives them). Upstream's attention layers call `update`, which writes the
    step's keys after the filled part and hands back views of the filled part: the shapes
    transformers' DynamicCache hands back, so attention does the same arithmetic."""

    def __init__(self, config, capacity, dtype, device, rows=1):
        head_dim = getattr(config, "head_dim", config.hidden_size // config.num_attention_heads)
        self._shape = (config.num_hidden_layers, rows, config.num_key_value_heads, capacity, head_dim)
        self.keys = torch.empty(self._shape, dtype=dtype, device=device)
        self.values = torch.empty_like(self.keys)
        self.length = 0  # positions filled by the steps before the current one
        self._end = 0

    def begin(self, positions):
        """Room for a step of `positions` more."""
        self._end = self.length + positions
        if self._end > self.keys.shape[3]:
            shape = list(self._shape)
            shape[3] = max(self._end, 2 * self.keys.shape[3])
            keys, values = self.keys.new_empty(shape), self.values.new_empty(shape)
            keys[:, :, :, :self.length] = self.keys[:, :, :, :self.length]
            values[:, :, :, :self.length] = self.values[:, :, :, :self.length]
            self.keys, self.values = keys, values

    def update(self, key, value, layer, cache_kwargs=None):
        self.keys[layer, :, :, self.length:self._end] = key
        self.values[layer, :, :, self.length:self._end] = value
        return self.keys[layer, :, :, :self._end], self.values[layer, :, :, :self._end]

    def end(self):
        self.length = self._end


def _causal_mask(positions, dtype, device):
    """The additive mask transformers' create_causal_mask makes for eager attention over a
    prompt with nothing cached and no padding: 0 where a position may look, the dtype's
    minimum above the diagonal. A one-position step needs none (upstream's adds zeros)."""
    allowed = torch.ones(positions, positions, dtype=torch.bool, device=device).tril()
    mask = torch.where(allowed, torch.tensor(0.0, dtype=dtype, device=device), torch.finfo(dtype).min)
    return mask.view(1, 1, positions, positions)


def _layers(model, hidden, cache, mask, rotary):
    """Upstream's decoder layers and final norm over `hidden`, as its model's forward runs them."""
    cache.begin(hidden.shape[1])
    for layer in model.layers:
        hidden = layer(hidden, attention_mask=mask, past_key_values=cache,
                       position_embeddings=rotary)[0]
    cache.end()
    return model.norm(hidden)


class _Stream:
    """One utterance's state: the prompt, both caches, both samplers."""

    def __init__(self, model, prompt, generator):
        talker = model.talker
        self.talker = talker
        self.predictor = talker.code_predictor
        embeds = prompt.pop("inputs_embeds")
        mask = prompt.pop("attention_mask")
        if embeds.shape[0] != 1 or not bool(mask.all()):
            raise ValueError("one utterance, unpadded, a stream")
        self.prompt_embeds = embeds
        self.trailing = prompt.pop("trailing_text_hidden")
        self.pad = prompt.pop("tts_pad_embed")
        sub = {name: prompt.pop(f"subtalker_{name}") for name in ("dosample", "top_k", "top_p", "temperature")}
        # Upstream asks for the talker's hidden states to read the frames from; not needed here.
        prompt.pop("output_hidden_states", None)
        self.sample = _Sampler(talker, prompt, embeds, True, generator)
        groups = talker.config.num_code_groups
        pair = torch.cat((embeds[:, -1:], embeds[:, -1:]), dim=1)
        self.sub_sample = _Sampler(
            self.predictor, dict(max_new_tokens=groups - 1, do_sample=sub["dosample"], top_p=sub["top_p"],
                                 top_k=sub["top_k"], temperature=sub["temperature"]),
            pair, False, generator)
        if self.sub_sample.eos:
            raise ValueError("the code predictor's generation config has an EOS; upstream's loop "
                             "assumes its 15 codes always come")
        dtype, device = embeds.dtype, embeds.device
        room = min(self.sample.max_length, _TALKER_ROOM)
        self.talker_cache = _Cache(talker.config, embeds.shape[1] + room, dtype, device)
        self.predictor_cache = _Cache(self.predictor.config, groups, dtype, device)
        self.prompt_mask = _causal_mask(embeds.shape[1], dtype, device)
        self.pair_mask = _causal_mask(2, dtype, device)
        # The code predictor's sub-steps sit at the same positions every frame: 0-1, then 2..15.
        rotary = self.predictor.model.rotary_emb
        self.sub_rotary = [rotary(pair, torch.arange(2, device=device).unsqueeze(0))] + [
            rotary(pair[:, :1], torch.tensor([[p]], device=device)) for p in range(2, groups)]
        self.tokens = torch.zeros(1, self.sample.max_length, dtype=torch.long, device=device)
        self.codes = torch.zeros(1, groups - 1, dtype=torch.long, device=device)

    def talker_step(self, embeds):
        """The talker over `embeds` at the next positions: (logits, last hidden state)."""
        length = self.talker_cache.length
        positions = torch.arange(length, length + embeds.shape[1], device=embeds.device, dtype=torch.float32)
        positions = positions.view(1, 1, -1).expand(3, 1, -1)
        rotary = self.talker.model.rotary_emb(embeds, positions)
        mask = self.prompt_mask if length == 0 else None
        hidden = _layers(self.talker.model, embeds, self.talker_cache, mask, rotary)
        return self.talker.codec_head(hidden), hidden[:, -1:, :]

    def predict(self, past_hidden, token):
        """Codebooks 1-15 of the frame whose codebook 0 is `token` ([1, 1]); and the talker's
        next input, the sum of the frame's 16 embeddings as upstream's talker forms it."""
        predictor = self.predictor
        embeddings = predictor.model.codec_embedding
        token_embed = self.talker.model.codec_embedding(token)
        self.predictor_cache.length = 0
        inputs = torch.cat((past_hidden, token_embed), dim=1)
        frame = [token_embed]
        for step in range(self.codes.shape[1]):
            hidden = _layers(predictor.model, predictor.small_to_mtp_projection(inputs),
                             self.predictor_cache, self.pair_mask if step == 0 else None,
                             self.sub_rotary[step])
            code = self.sub_sample(self.codes[:, :step], predictor.lm_head[step](hidden))
            self.codes[:, step] = code
            inputs = embeddings[step](code.view(1, 1))
            frame.append(inputs)
        return self.codes[0].tolist(), torch.cat(frame, dim=1).sum(1, keepdim=True)


@torch.inference_mode()
def stream_codes(model, *, input_ids, instruct_ids=None, ref_ids=None, voice_clone_prompt=None,
                 language="auto", speaker=None, non_streaming_mode=False, seed=None,
                 generator=None, cancel=None, **gen):
    """Yield each frame's 16 codes (a list of ints) the moment the code predictor makes them.

    The arguments of `qwencodec_talker.stream_codes` (those of upstream's `generate` for one
    utterance, `gen` as `generate_kwargs` makes them), except that the loop runs in the
    caller's thread and draws from a `torch.Generator` of its own: `generator`, or one seeded
    with `seed`; neither: torch's global generator, as upstream. `cancel` (a threading.Event)
    or closing the generator stops it before the next step.
    """
    if seed is not None and generator is not None:
        raise ValueError("seed or generator, not both")
    prompt = upstream_prompt(model, input_ids=input_ids, instruct_ids=instruct_ids, ref_ids=ref_ids,
                             voice_clone_prompt=voice_clone_prompt, language=language,
                             speaker=speaker, non_streaming_mode=non_streaming_mode, **gen)
    if seed is not None:
        generator = torch.Generator(device=model.talker.device).manual_seed(seed)
    stream = _Stream(model, prompt, generator)
    sample, tokens = stream.sample, stream.tokens
    logits, past_hidden = stream.talker_step(stream.prompt_embeds)
    token = sample(tokens[:, :0], logits)
    made = 1
    tokens[:, 0] = token
    while int(token) not in sample.eos and made < sample.max_length:
        if cancel is not None and cancel.is_set():
            return
        codes, embeds = stream.predict(past_hidden, token.view(1, 1))
        yield [int(token)] + codes
        step = made - 1
        if step < stream.trailing.shape[1]:
            embeds = embeds + stream.trailing[:, step].unsqueeze(1)
        else:
            embeds = embeds + stream.pad
        if cancel is not None and cancel.is_set():
            return
        logits, past_hidden = stream.talker_step(embeds)
        token = sample(tokens[:, :made], logits)
        tokens[:, made] = token
        made += 1


class _RowsCache:
    """The talker's keys and values for the rows of a batch, each row a stream at its own
    length. Rows in use are the first `len(lengths)`; a stream that leaves is replaced by the
    last row, so a step always reads one contiguous block. A step adds one position a row,
    written at that row's length; attention reads up to the longest row, a mask hiding each
    shorter row's unfilled tail (values left there are finite: zeros or a former row's)."""

    def __init__(self, config, dtype, device):
        head_dim = getattr(config, "head_dim", config.hidden_size // config.num_attention_heads)
        self._shape = [config.num_hidden_layers, 1, config.num_key_value_heads, _TALKER_ROOM, head_dim]
        self.keys = torch.zeros(self._shape, dtype=dtype, device=device)
        self.values = torch.zeros_like(self.keys)
        self.lengths = []
        self._end = 0

    def _grow(self, rows, positions):
        shape = list(self.keys.shape)
        if rows <= shape[1] and positions <= shape[3]:
            return
        shape[1] = max(rows, shape[1] if rows <= shape[1] else 2 * shape[1])
        shape[3] = max(positions, shape[3] if positions <= shape[3] else 2 * shape[3])
        keys, values = self.keys.new_zeros(shape), self.values.new_zeros(shape)
        used, filled = len(self.lengths), max(self.lengths, default=0)
        keys[:, :used, :, :filled] = self.keys[:, :used, :, :filled]
        values[:, :used, :, :filled] = self.values[:, :used, :, :filled]
        self.keys, self.values = keys, values

    def add(self, cache):
        """A new last row holding a stream's solo cache (`_Cache`, after its prompt)."""
        row, length = len(self.lengths), cache.length
        self._grow(row + 1, length + 1)
        self.keys[:, row, :, :length] = cache.keys[:, 0, :, :length]
        self.values[:, row, :, :length] = cache.values[:, 0, :, :length]
        self.lengths.append(length)

    def remove(self, row):
        """Drop `row`, moving the last row into its place."""
        last = len(self.lengths) - 1
        if row != last:
            length = self.lengths[last]
            self.keys[:, row, :, :length] = self.keys[:, last, :, :length]
            self.values[:, row, :, :length] = self.values[:, last, :, :length]
            self.lengths[row] = length
        self.lengths.pop()

    def mask(self, dtype):
        """[rows, 1, 1, longest + 1]: 0 up to each row's new position, the dtype's minimum after."""
        lengths = torch.tensor(self.lengths, device=self.keys.device)
        allowed = torch.arange(max(self.lengths) + 1, device=self.keys.device) <= lengths[:, None]
        mask = torch.where(allowed, torch.tensor(0.0, dtype=dtype, device=self.keys.device),
                           torch.finfo(dtype).min)
        return mask[:, None, None, :]

    def begin(self, positions):
        if positions != 1:
            raise ValueError("a batch step is one position a row")
        self._rows = torch.arange(len(self.lengths), device=self.keys.device)
        self._at = torch.tensor(self.lengths, device=self.keys.device)
        self._end = max(self.lengths) + 1
        self._grow(len(self.lengths), self._end)

    def update(self, key, value, layer, cache_kwargs=None):
        rows = len(self.lengths)
        self.keys[layer][self._rows, :, self._at] = key[:, :, 0]
        self.values[layer][self._rows, :, self._at] = value[:, :, 0]
        return self.keys[layer, :rows, :, :self._end], self.values[layer, :rows, :, :self._end]

    def end(self):
        self.lengths = [length + 1 for length in self.lengths]


class Batch:
    """Streams of one model stepped together: each `step` makes a frame for every stream in
    one talker forward and 15 code-predictor forwards with a row per stream, so the weights
    are read once for all. Streams join (`add`, which runs the new stream's prompt alone) and
    leave (EOS, the token limit, `remove`) between steps; each has its own position, cache
    length, sampling options and generator. A stream's codes are its `stream_codes` run's at
    f32 on a CPU: its rows see the same operations on the same values, torch's f32 products sum
    a row alike whatever shares it, and its draws come from its own generator in the same order
    (tests/talker/test_batch.py checks greedy and seeded runs). In bf16 torch's products round
    a row differently beside others, so codes can part from the solo run's (the benchmark,
    tools/bench_talker_loop.py, shows where).
    Streams without `seed` or `generator` that sample draw from torch's global generator in
    turn, so their codes depend on their companions'."""

    def __init__(self, model):
        self.model = model
        talker = model.talker
        self._talker = talker
        self._predictor = talker.code_predictor
        self._streams = []  # row r's _Stream, with its key, current token and frames made
        self._keys = []
        self._tokens = []
        self._hidden = None  # [rows, 1, hidden]: each row's last talker state
        self._next_key = 0
        self._ended = []
        self._cache = None
        self._predictor_caches = {}
        self._sub_rotary = None

    def __len__(self):
        return len(self._streams)

    @torch.inference_mode()
    def add(self, *, input_ids, instruct_ids=None, ref_ids=None, voice_clone_prompt=None,
            language="auto", speaker=None, non_streaming_mode=False, seed=None, generator=None,
            **gen):
        """Start a stream (the arguments of `stream_codes`); its prompt runs now, alone, and its
        first frame comes with the next `step`. Returns its key."""
        if seed is not None and generator is not None:
            raise ValueError("seed or generator, not both")
        model = self.model
        prompt = upstream_prompt(model, input_ids=input_ids, instruct_ids=instruct_ids, ref_ids=ref_ids,
                                 voice_clone_prompt=voice_clone_prompt, language=language,
                                 speaker=speaker, non_streaming_mode=non_streaming_mode, **gen)
        if seed is not None:
            generator = torch.Generator(device=self._talker.device).manual_seed(seed)
        stream = _Stream(model, prompt, generator)
        logits, hidden = stream.talker_step(stream.prompt_embeds)
        token = stream.sample(stream.tokens[:, :0], logits)
        stream.tokens[:, 0] = token
        stream.made = 1
        key = self._next_key
        self._next_key += 1
        if int(token) in stream.sample.eos or stream.made >= stream.sample.max_length:
            self._ended.append(key)
            return key
        if self._cache is None:
            self._cache = _RowsCache(self._talker.config, hidden.dtype, hidden.device)
            self._sub_rotary = stream.sub_rotary
            self._pair_mask = stream.pair_mask
        self._cache.add(stream.talker_cache)
        stream.talker_cache = stream.predictor_cache = None
        self._streams.append(stream)
        self._keys.append(key)
        self._tokens.append(token.view(1, 1))
        self._hidden = hidden if self._hidden is None else torch.cat((self._hidden, hidden))
        return key

    @torch.inference_mode()
    def remove(self, key):
        """End a stream before its next step (a cancel); unknown or ended keys are ignored."""
        if key in self._keys:
            self._drop(self._keys.index(key))

    def _drop(self, row):
        last = len(self._streams) - 1
        self._cache.remove(row)
        for rows in (self._streams, self._keys, self._tokens):
            rows[row] = rows[last]
            rows.pop()
        if row != last:
            self._hidden[row] = self._hidden[last]
        self._hidden = self._hidden[:last]

    @torch.inference_mode()
    def step(self):
        """One frame for every stream: ({key: its 16 codes}, [keys that make no more frames,
        now gone from the batch, including those whose prompt ended at once])."""
        ended, self._ended = self._ended, []
        if not self._streams:
            return {}, ended
        tokens = torch.cat(self._tokens)
        codes, embeds = self._predict(tokens)
        frames = {key: [int(tokens[row])] + codes[row]
                  for row, key in enumerate(self._keys)}
        addends = []
        for stream in self._streams:
            step = stream.made - 1
            addends.append(stream.trailing[:, step].unsqueeze(1) if step < stream.trailing.shape[1]
                           else stream.pad)
        embeds = embeds + torch.cat(addends)
        logits, self._hidden = self._talker_step(embeds)
        done = []
        for row, stream in enumerate(self._streams):
            token = stream.sample(stream.tokens[:, :stream.made], logits[row:row + 1])
            stream.tokens[:, stream.made] = token
            stream.made += 1
            self._tokens[row] = token.view(1, 1)
            if int(token) in stream.sample.eos or stream.made >= stream.sample.max_length:
                done.append(row)
        for row in reversed(done):
            ended.append(self._keys[row])
            self._drop(row)
        return frames, ended

    def _talker_step(self, embeds):
        """The talker over one position a row, each at its own length: (logits, last hidden)."""
        cache, talker = self._cache, self._talker
        rows = embeds.shape[0]
        positions = torch.tensor(cache.lengths, device=embeds.device, dtype=torch.float32)
        positions = positions.view(1, rows, 1).expand(3, rows, 1)
        rotary = talker.model.rotary_emb(embeds, positions)
        hidden = _layers(talker.model, embeds, cache, cache.mask(embeds.dtype), rotary)
        return talker.codec_head(hidden), hidden

    def _predict(self, tokens):
        """Codebooks 1-15 of every row's frame (lists of ints), and the talker's next inputs."""
        predictor, talker = self._predictor, self._talker
        rows = tokens.shape[0]
        cache = self._predictor_caches.get(rows)
        if cache is None:
            cache = self._predictor_caches[rows] = _Cache(
                predictor.config, talker.config.num_code_groups, self._hidden.dtype, self._hidden.device, rows)
        cache.length = 0
        embeddings = predictor.model.codec_embedding
        token_embed = talker.model.codec_embedding(tokens)
        inputs = torch.cat((self._hidden, token_embed), dim=1)
        frame = [token_embed]
        groups = talker.config.num_code_groups - 1
        codes = torch.zeros(rows, groups, dtype=torch.long, device=tokens.device)
        for step in range(groups):
            hidden = _layers(predictor.model, predictor.small_to_mtp_projection(inputs), cache,
                             self._pair_mask if step == 0 else None, self._sub_rotary[step])
            logits = predictor.lm_head[step](hidden)
            for row, stream in enumerate(self._streams):
                codes[row, step] = stream.sub_sample(codes[row:row + 1, :step], logits[row:row + 1])
            inputs = embeddings[step](codes[:, step:step + 1])
            frame.append(inputs)
        return codes.tolist(), torch.cat(frame, dim=1).sum(1, keepdim=True)
