// A client of LLM APIs, written with each vendor's official SDK as its
// users write one: OpenAI (openai), Anthropic (@anthropic-ai/sdk), Gemini
// (@google/genai), Ollama (ollama) and Bedrock
// (@aws-sdk/client-bedrock-runtime). The tests run it with a JSON plan as
// its argument:
//
//   {"calls": [{"api": "chat" | "completions" | "responses" | "messages" |
//       "gemini" | "ollama-chat" | "ollama-generate" | "converse" |
//       "converse-stream",
//     "baseURL": "http://127.0.0.1:port", "apiKey": "...", "model": "...",
//     "stream": false, "includeUsage": false, "maxTokens": 30,
//     "n": 1, "bestOf": 1, "candidateCount": 1, "content": "...",
//     "drop": false, "headers": {}, "extraBody": {} | "{...}",
//     "parts": [...], "params": {},
//     "http2": false, "sigv4": false, "defaultRetries": false,
//     "withinMs": 0}],
//    "parallel": false}
//
// and reads, on stdout, one JSON result per call: {status, retryAfter,
// rateLimit, rateLimitPolicy, sdkHeaders, tokens, final, text, choices,
// usage, error, errorType, message, ms}.
// tokens is the vendor's whole usage as the SDK saw it (OpenAI's
// total_tokens; Anthropic's input_tokens + cache_creation_input_tokens +
// cache_read_input_tokens + output_tokens; Gemini's totalTokenCount;
// Ollama's prompt_eval_count + eval_count; Bedrock's totalTokens), the
// latest the stream gave (a stream dropped after Anthropic's
// message_start has seen its input tokens, after Gemini's first chunk its
// running totals); final is whether that was the answer's final usage
// (the whole document's, the usage chunk, response.completed,
// message_delta, the chunk with a finishReason, Ollama's done object,
// Bedrock's metadata); usage is that usage object; text is the first
// choice's; choices counts the choices seen; error is the class name of
// the error that ended the call, if one did, and message its message (a
// refused call has the status of its refusal; a stream that broke off
// keeps its status and what it got; any other error has status -1).
//
// OpenAI's and Anthropic's clients make no retries, unless defaultRetries
// leaves them at their SDK's default (2, after retry-after-ms or
// Retry-After, unless x-should-retry says false); Gemini's makes none by
// default, Bedrock's one attempt. A call with withinMs gives up after that
// many milliseconds, with status -1 and the error "TimedOut", and ms is how
// long the call took, its retries and sleeps included. sdkHeaders are the
// last response's x-ratelimit-*, anthropic-ratelimit-*, x-should-retry and
// retry-after-ms headers; errorType is the error's type as its body says
// (OpenAI's error.type, then its code after a slash; Anthropic's
// error.type).
//
// maxTokens is each API's output bound (max_tokens, max_output_tokens,
// generationConfig.maxOutputTokens, options.num_predict,
// inferenceConfig.maxTokens), left out when 0. n, bestOf and
// candidateCount go where their API takes them. A call with drop reads
// the first event of its stream and hangs up. extraBody is raw fields put
// at the end of the request body's top-level object, after the SDK's own
// (an object, or a JSON text, which may hold duplicate keys:
// '{"max_tokens":1,"Max_Tokens":50000}'), through each SDK's own hook:
// the fetch option of OpenAI, Anthropic, Gemini (httpOptions.fetch) and
// Ollama, a build-step middleware for Bedrock. parts, when set, is the
// user message's content in place of content (a list of content parts:
// images, files; for completions the prompt, a list of prompts), and
// params are more of the SDK's parameters (previous_response_id, tools),
// for chat, completions, responses and messages. The api
// "messages-batch" creates an Anthropic Message Batch of the requests in
// parts, "openai-batch" an OpenAI batch of the file params.input_file_id.
//
// The header each SDK sends its key in, at these versions:
//   openai 6.30.1                         Authorization: Bearer <apiKey>
//   @anthropic-ai/sdk 1.15.0              Authorization: Bearer <apiKey> (no x-api-key)
//   @google/genai 3.3.0                   x-goog-api-key: <apiKey>
//   ollama 0.6.4                          none of its own (it adds one only for
//                                         https://ollama.com from OLLAMA_API_KEY): this client
//                                         passes Authorization: Bearer <apiKey> in its headers
//                                         option, as a gateway's user would
//   @aws-sdk/client-bedrock-runtime 3.1178.0  Authorization: Bearer <apiKey>: a Bedrock API key,
//                                         given as the client's token option with
//                                         authSchemePreference ["httpBearerAuth"] (what
//                                         AWS_BEARER_TOKEN_BEDROCK sets up); with sigv4, a SigV4
//                                         signature of the access key ID <apiKey> and a fixed
//                                         secret
// Bedrock's client speaks HTTP/1.1 here (@smithy/node-http-handler's
// NodeHttpHandler), which a proxy in front takes; with http2 it speaks
// the SDK's default, HTTP/2 (NodeHttp2Handler: cleartext to an http://
// endpoint).
import OpenAI from "openai";
import Anthropic from "@anthropic-ai/sdk";
import { GoogleGenAI } from "@google/genai";
import { Ollama } from "ollama";
import { BedrockRuntimeClient, ConverseCommand, ConverseStreamCommand } from "@aws-sdk/client-bedrock-runtime";
import { NodeHttpHandler, NodeHttp2Handler } from "@smithy/node-http-handler";

// stdout is the results' alone: what an SDK logs goes to stderr.
console.log = console.info = console.debug = (...args) => console.error(...args);

const plan = JSON.parse(process.argv[2]);

const defaultModels = {
  chat: "chat-model-mini",
  completions: "text-model-instruct",
  responses: "chat-model-mini",
  messages: "messages-model",
  gemini: "gen-model-flash",
  "ollama-chat": "local-model",
  "ollama-generate": "local-model",
  converse: "vendor.text-model-v1:0",
  "converse-stream": "vendor.text-model-v1:0",
};

// headersOf reads the rate-limit headers of a Headers, or of a plain
// object of lower-case names.
function headersOf(h) {
  const get = (name) => (typeof h?.get === "function" ? h.get(name) : h?.[name]) ?? "";
  const sdkHeaders = {};
  const names = typeof h?.keys === "function" ? [...h.keys()] : Object.keys(h ?? {});
  for (const name of names) {
    const n = name.toLowerCase();
    if (n.startsWith("x-ratelimit-") || n.startsWith("anthropic-ratelimit-") || n === "x-should-retry" || n === "retry-after-ms") sdkHeaders[n] = get(name);
  }
  return { retryAfter: get("retry-after"), rateLimit: get("ratelimit"), rateLimitPolicy: get("ratelimit-policy"), sdkHeaders };
}

// withExtra puts the members of extra at the end of the JSON object body.
function withExtra(body, extra) {
  if (extra === undefined || extra === null || typeof body !== "string") return body;
  const raw = (typeof extra === "string" ? extra : JSON.stringify(extra)).trim();
  const members = raw.replace(/^\{/, "").replace(/\}$/, "").trim();
  const head = body.trimEnd();
  if (members === "" || !head.endsWith("}")) return body;
  const open = head.slice(0, -1).trimEnd();
  return open + (open.endsWith("{") ? "" : ",") + members + "}";
}

// hookedFetch is a fetch that adds c.extraBody to the body and keeps the
// last response's status and headers in seen.
function hookedFetch(c, seen) {
  return async (url, init) => {
    if (init && c.extraBody !== undefined) init = { ...init, body: withExtra(init.body, c.extraBody) };
    const res = await fetch(url, init);
    seen.status = res.status;
    seen.headers = res.headers;
    return res;
  };
}

// openaiCall runs chat, completions and responses.
async function openaiCall(c, seen, r) {
  const client = new OpenAI({ baseURL: c.baseURL + "/v1", apiKey: c.apiKey, maxRetries: c.defaultRetries ? undefined : 0, timeout: 30000, defaultHeaders: c.headers, fetch: hookedFetch(c, seen) });
  const model = c.model ?? defaultModels[c.api];
  const sawUsage = (u) => {
    if (u) {
      r.usage = u;
      r.tokens = u.total_tokens;
      r.final = true;
    }
  };
  if (c.api === "chat" || c.api === "completions") {
    const params = c.api === "chat" ? { model, messages: [{ role: "user", content: c.parts ?? c.content }] } : { model, prompt: c.parts ?? c.content };
    Object.assign(params, c.params);
    if (c.maxTokens) params.max_tokens = c.maxTokens;
    if (c.n) params.n = c.n;
    if (c.bestOf) params.best_of = c.bestOf;
    const create = (p) => (c.api === "chat" ? client.chat.completions.create(p) : client.completions.create(p));
    if (!c.stream) {
      const { data, response } = await create(params).withResponse();
      sawUsage(data.usage);
      const first = data.choices[0];
      Object.assign(r, headersOf(response.headers), { status: response.status, text: (c.api === "chat" ? first.message.content : first.text) ?? "", choices: data.choices.length });
      return;
    }
    if (c.includeUsage) params.stream_options = { include_usage: true };
    const { data: stream, response } = await create({ ...params, stream: true }).withResponse();
    Object.assign(r, headersOf(response.headers), { status: response.status });
    const indexes = new Set();
    for await (const chunk of stream) {
      for (const choice of chunk.choices) {
        indexes.add(choice.index);
        if (choice.index === 0) r.text += (c.api === "chat" ? choice.delta.content : choice.text) ?? "";
      }
      sawUsage(chunk.usage);
      if (c.drop) {
        stream.controller.abort();
        break;
      }
    }
    r.choices = indexes.size;
    return;
  }
  const params = { model, input: c.parts ? [{ role: "user", content: c.parts }] : c.content };
  Object.assign(params, c.params);
  if (c.maxTokens) params.max_output_tokens = c.maxTokens;
  if (!c.stream) {
    const { data, response } = await client.responses.create(params).withResponse();
    sawUsage(data.usage);
    Object.assign(r, headersOf(response.headers), { status: response.status, text: data.output_text, choices: 1 });
    return;
  }
  const { data: stream, response } = await client.responses.create({ ...params, stream: true }).withResponse();
  Object.assign(r, headersOf(response.headers), { status: response.status });
  for await (const event of stream) {
    if (event.type === "response.output_text.delta") {
      r.text += event.delta;
      r.choices = 1;
    }
    if (event.type === "response.completed") sawUsage(event.response.usage);
    if (c.drop) {
      stream.controller.abort();
      break;
    }
  }
}

// anthropicTokens is the whole of an Anthropic usage.
function anthropicTokens(u) {
  return (u.input_tokens ?? 0) + (u.cache_creation_input_tokens ?? 0) + (u.cache_read_input_tokens ?? 0) + (u.output_tokens ?? 0);
}

async function anthropicCall(c, seen, r) {
  const client = new Anthropic({ baseURL: c.baseURL, apiKey: c.apiKey, maxRetries: c.defaultRetries ? undefined : 0, timeout: 30000, defaultHeaders: c.headers, fetch: hookedFetch(c, seen) });
  const params = { model: c.model ?? defaultModels.messages, messages: [{ role: "user", content: c.parts ?? c.content }] };
  Object.assign(params, c.params);
  if (c.maxTokens) params.max_tokens = c.maxTokens;
  if (!c.stream) {
    const { data, response } = await client.messages.create(params).withResponse();
    Object.assign(r, headersOf(response.headers), { status: response.status, tokens: anthropicTokens(data.usage), usage: data.usage, final: true, text: data.content[0].text, choices: 1 });
    return;
  }
  const { data: stream, response } = await client.messages.create({ ...params, stream: true }).withResponse();
  Object.assign(r, headersOf(response.headers), { status: response.status });
  // message_start holds the input usage, message_delta the usage so far,
  // its null members standing for those of message_start.
  let usage = null;
  for await (const event of stream) {
    if (event.type === "message_start") usage = { ...event.message.usage };
    if (event.type === "message_delta") {
      usage = { ...(usage ?? {}) };
      for (const [k, v] of Object.entries(event.usage)) if (v !== null && v !== undefined) usage[k] = v;
      r.final = true;
    }
    if (usage) {
      r.usage = usage;
      r.tokens = anthropicTokens(usage);
    }
    if (event.type === "content_block_delta") {
      r.text += event.delta.text;
      r.choices = 1;
    }
    if (c.drop) {
      stream.controller.abort();
      break;
    }
  }
}

async function geminiCall(c, seen, r) {
  const ai = new GoogleGenAI({ apiKey: c.apiKey, httpOptions: { baseUrl: c.baseURL, headers: c.headers, timeout: 30000, fetch: hookedFetch(c, seen) } });
  const config = {};
  if (c.maxTokens) config.maxOutputTokens = c.maxTokens;
  if (c.candidateCount) config.candidateCount = c.candidateCount;
  const params = { model: c.model ?? defaultModels.gemini, contents: c.content, config };
  const sawUsage = (resp) => {
    if (resp.usageMetadata) {
      r.usage = resp.usageMetadata;
      r.tokens = resp.usageMetadata.totalTokenCount ?? 0;
      r.final = !!resp.candidates?.[0]?.finishReason;
    }
  };
  const firstText = (resp) => (resp.candidates?.[0]?.content?.parts ?? []).map((p) => p.text ?? "").join("");
  if (!c.stream) {
    const resp = await ai.models.generateContent(params);
    sawUsage(resp);
    Object.assign(r, headersOf(seen.headers), { status: seen.status, text: firstText(resp), choices: resp.candidates?.length ?? 0 });
    return;
  }
  const abort = new AbortController();
  config.abortSignal = abort.signal;
  const stream = await ai.models.generateContentStream(params);
  Object.assign(r, headersOf(seen.headers), { status: seen.status });
  for await (const chunk of stream) {
    r.text += firstText(chunk);
    r.choices = Math.max(r.choices, chunk.candidates?.length ?? 0);
    sawUsage(chunk);
    if (c.drop) {
      abort.abort();
      break;
    }
  }
}

async function ollamaCall(c, seen, r) {
  const headers = { ...(c.headers ?? {}) };
  if (c.apiKey && !Object.keys(headers).some((h) => h.toLowerCase() === "authorization")) headers.Authorization = `Bearer ${c.apiKey}`;
  const client = new Ollama({ host: c.baseURL, headers, fetch: hookedFetch(c, seen) });
  const params = { model: c.model ?? defaultModels[c.api], stream: !!c.stream };
  if (c.maxTokens) params.options = { num_predict: c.maxTokens };
  const chat = c.api === "ollama-chat";
  if (chat) params.messages = [{ role: "user", content: c.content }];
  else params.prompt = c.content;
  const piece = (part) => (chat ? part.message?.content : part.response) ?? "";
  const sawDone = (part) => {
    if (part.done) {
      r.usage = { prompt_eval_count: part.prompt_eval_count, eval_count: part.eval_count };
      r.tokens = (part.prompt_eval_count ?? 0) + (part.eval_count ?? 0);
      r.final = true;
    }
  };
  if (!c.stream) {
    const resp = chat ? await client.chat(params) : await client.generate(params);
    sawDone(resp);
    Object.assign(r, headersOf(seen.headers), { status: seen.status, text: piece(resp), choices: 1 });
    return;
  }
  const stream = chat ? await client.chat(params) : await client.generate(params);
  Object.assign(r, headersOf(seen.headers), { status: seen.status });
  for await (const part of stream) {
    r.text += piece(part);
    r.choices = 1;
    sawDone(part);
    if (c.drop) {
      stream.abort();
      break;
    }
  }
}

// capturing wraps a request handler, keeping each response's status and
// headers in seen.
function capturing(inner, seen) {
  return {
    handle: async (request, options) => {
      const out = await inner.handle(request, options);
      seen.status = out.response.statusCode;
      seen.headers = out.response.headers;
      return out;
    },
    updateHttpClientConfig: (key, value) => inner.updateHttpClientConfig(key, value),
    httpHandlerConfigs: () => inner.httpHandlerConfigs(),
    destroy: () => inner.destroy(),
  };
}

async function bedrockCall(c, seen, r) {
  const inner = c.http2 ? new NodeHttp2Handler({ requestTimeout: 30000 }) : new NodeHttpHandler({ requestTimeout: 30000 });
  const auth = c.sigv4
    ? { credentials: { accessKeyId: c.apiKey, secretAccessKey: "llmsdk-secret" }, authSchemePreference: ["sigv4"] }
    : { token: { token: c.apiKey }, authSchemePreference: ["httpBearerAuth"] };
  const client = new BedrockRuntimeClient({ region: "us-east-1", endpoint: c.baseURL, maxAttempts: 1, requestHandler: capturing(inner, seen), ...auth });
  client.middlewareStack.add(
    (next) => async (args) => {
      if (c.headers) Object.assign(args.request.headers, c.headers);
      let body = args.request.body;
      if (body instanceof Uint8Array) body = new TextDecoder().decode(body);
      if (c.extraBody !== undefined && typeof body === "string") {
        args.request.body = withExtra(body, c.extraBody);
        for (const h of Object.keys(args.request.headers)) if (h.toLowerCase() === "content-length") delete args.request.headers[h];
        args.request.headers["content-length"] = String(Buffer.byteLength(args.request.body));
      }
      return next(args);
    },
    { step: "build", name: "llmsdkRequestEdits", priority: "low" },
  );
  const input = { modelId: c.model ?? defaultModels[c.api], messages: [{ role: "user", content: [{ text: c.content }] }] };
  if (c.maxTokens) input.inferenceConfig = { maxTokens: c.maxTokens };
  const sawUsage = (u) => {
    if (u) {
      r.usage = u;
      r.tokens = u.totalTokens ?? 0;
      r.final = true;
    }
  };
  try {
    if (c.api === "converse") {
      const out = await client.send(new ConverseCommand(input));
      sawUsage(out.usage);
      const text = (out.output?.message?.content ?? []).map((b) => b.text ?? "").join("");
      Object.assign(r, headersOf(seen.headers), { status: out.$metadata.httpStatusCode, text, choices: 1 });
      return;
    }
    const abort = new AbortController();
    const out = await client.send(new ConverseStreamCommand(input), { abortSignal: abort.signal });
    Object.assign(r, headersOf(seen.headers), { status: out.$metadata.httpStatusCode });
    for await (const event of out.stream) {
      if (event.contentBlockDelta) {
        r.text += event.contentBlockDelta.delta?.text ?? "";
        r.choices = 1;
      }
      if (event.metadata) sawUsage(event.metadata.usage);
      if (c.drop) {
        abort.abort();
        break;
      }
    }
  } finally {
    client.destroy();
  }
}

const calls = {
  chat: openaiCall,
  completions: openaiCall,
  responses: openaiCall,
  messages: anthropicCall,
  gemini: geminiCall,
  "ollama-chat": ollamaCall,
  "ollama-generate": ollamaCall,
  converse: bedrockCall,
  "converse-stream": bedrockCall,
};

// batchCall creates a batch: Anthropic's of the requests in c.parts,
// OpenAI's of the file in c.params.
async function batchCall(c, seen, r) {
  let data, response;
  if (c.api === "messages-batch") {
    const client = new Anthropic({ baseURL: c.baseURL, apiKey: c.apiKey, maxRetries: 0, timeout: 30000, defaultHeaders: c.headers, fetch: hookedFetch(c, seen) });
    ({ data, response } = await client.messages.batches.create({ requests: c.parts }).withResponse());
  } else {
    const client = new OpenAI({ baseURL: c.baseURL + "/v1", apiKey: c.apiKey, maxRetries: 0, timeout: 30000, defaultHeaders: c.headers, fetch: hookedFetch(c, seen) });
    ({ data, response } = await client.batches.create({ endpoint: "/v1/chat/completions", completion_window: "24h", ...c.params }).withResponse());
  }
  Object.assign(r, headersOf(response.headers), { status: response.status, text: data.id ?? "" });
}
calls["messages-batch"] = batchCall;
calls["openai-batch"] = batchCall;
class TimedOut extends Error {}

async function call(c) {
  const seen = {};
  const r = { status: 0, retryAfter: "", rateLimit: "", rateLimitPolicy: "", sdkHeaders: {}, tokens: 0, final: false, text: "", choices: 0, usage: null, errorType: "" };
  const start = performance.now();
  try {
    const run = calls[c.api];
    if (!run) throw new Error(`no api ${c.api}`);
    if (!c.withinMs) {
      await run(c, seen, r);
    } else {
      let timer;
      const late = new Promise((_, reject) => {
        timer = setTimeout(() => reject(new TimedOut(`no answer within ${c.withinMs} ms`)), c.withinMs);
      });
      try {
        await Promise.race([run(c, seen, r), late]);
      } finally {
        clearTimeout(timer);
      }
    }
  } catch (err) {
    // A refused call has the SDK's status (OpenAI, Anthropic, Gemini:
    // status; Ollama: status_code; Bedrock: $metadata.httpStatusCode); a
    // stream that broke off keeps what it got, and its status; any other
    // error has status -1.
    const status = err?.status ?? err?.status_code ?? err?.$metadata?.httpStatusCode;
    if (status) {
      Object.assign(r, headersOf(err?.headers ?? seen.headers), { status, tokens: 0, final: false, text: "", choices: 0, usage: null });
    } else if (!r.status) {
      r.status = -1;
    }
    r.error = err?.constructor?.name ?? "Error";
    r.message = String(err?.message ?? err);
    const body = err?.error;
    if (typeof err?.type === "string") r.errorType = err.type + (err.code ? "/" + err.code : "");
    else if (typeof body?.error?.type === "string") r.errorType = body.error.type;
  }
  r.ms = Math.round(performance.now() - start);
  return r;
}

let results;
if (plan.parallel) {
  results = await Promise.all(plan.calls.map(call));
} else {
  results = [];
  for (const c of plan.calls) results.push(await call(c));
}
// A call given up on (withinMs) may still have an SDK asleep: exit once
// the results are out rather than wait for it.
process.stdout.write(JSON.stringify(results), () => process.exit(0));
