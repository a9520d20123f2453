// A client of the AI gateway recipe, written with the official OpenAI and
// Anthropic SDKs as their users write one. aigateway_test.go runs it with a
// JSON plan as its argument:
//
//   {"calls": [{"api": "chat" | "responses" | "messages", "baseURL": "...",
//     "apiKey": "...", "stream": false, "includeUsage": false,
//     "maxTokens": 30, "content": "...", "drop": false, "headers": {}}],
//    "parallel": false}
//
// and reads, on stdout, one JSON result per call: its status, its
// rate-limit headers, and the tokens the SDK saw reported (input + output).
// A call with drop reads the first event of its stream and hangs up.
import OpenAI from "openai";
import Anthropic from "@anthropic-ai/sdk";

const plan = JSON.parse(process.argv[2]);

function headersOf(h) {
  return {
    status: 0,
    retryAfter: h?.get("retry-after") ?? "",
    rateLimit: h?.get("ratelimit") ?? "",
    rateLimitPolicy: h?.get("ratelimit-policy") ?? "",
  };
}

async function openaiCall(c) {
  const client = new OpenAI({ baseURL: c.baseURL + "/v1", apiKey: c.apiKey, maxRetries: 0, timeout: 30000, defaultHeaders: c.headers });
  if (c.api === "chat") {
    const params = { model: "m", max_tokens: c.maxTokens, messages: [{ role: "user", content: c.content }] };
    if (!c.stream) {
      const { data, response } = await client.chat.completions.create(params).withResponse();
      return { ...headersOf(response.headers), status: response.status, tokens: data.usage.prompt_tokens + data.usage.completion_tokens, text: data.choices[0].message.content };
    }
    if (c.includeUsage) params.stream_options = { include_usage: true };
    const { data: stream, response } = await client.chat.completions.create({ ...params, stream: true }).withResponse();
    const r = { ...headersOf(response.headers), status: response.status, tokens: 0, text: "" };
    for await (const chunk of stream) {
      if (chunk.choices.length > 0) r.text += chunk.choices[0].delta.content ?? "";
      if (chunk.usage) r.tokens = chunk.usage.prompt_tokens + chunk.usage.completion_tokens;
      if (c.drop) {
        stream.controller.abort();
        break;
      }
    }
    return r;
  }
  const params = { model: "m", max_output_tokens: c.maxTokens, input: c.content };
  if (!c.stream) {
    const { data, response } = await client.responses.create(params).withResponse();
    return { ...headersOf(response.headers), status: response.status, tokens: data.usage.input_tokens + data.usage.output_tokens, text: data.output_text };
  }
  const { data: stream, response } = await client.responses.create({ ...params, stream: true }).withResponse();
  const r = { ...headersOf(response.headers), status: response.status, tokens: 0, text: "" };
  for await (const event of stream) {
    if (event.type === "response.output_text.delta") r.text += event.delta;
    if (event.type === "response.completed") r.tokens = event.response.usage.input_tokens + event.response.usage.output_tokens;
    if (c.drop) {
      stream.controller.abort();
      break;
    }
  }
  return r;
}

async function anthropicCall(c) {
  const client = new Anthropic({ baseURL: c.baseURL, apiKey: c.apiKey, maxRetries: 0, timeout: 30000, defaultHeaders: c.headers });
  const params = { model: "m", max_tokens: c.maxTokens, messages: [{ role: "user", content: c.content }] };
  if (!c.stream) {
    const { data, response } = await client.messages.create(params).withResponse();
    return { ...headersOf(response.headers), status: response.status, tokens: data.usage.input_tokens + data.usage.output_tokens, text: data.content[0].text };
  }
  const { data: stream, response } = await client.messages.create({ ...params, stream: true }).withResponse();
  const r = { ...headersOf(response.headers), status: response.status, tokens: 0, text: "" };
  let input = 0;
  for await (const event of stream) {
    if (event.type === "message_start") input = event.message.usage.input_tokens;
    if (event.type === "content_block_delta") r.text += event.delta.text;
    if (event.type === "message_delta") r.tokens = input + event.usage.output_tokens;
    if (c.drop) {
      stream.controller.abort();
      break;
    }
  }
  return r;
}

async function call(c) {
  try {
    return await (c.api === "messages" ? anthropicCall(c) : openaiCall(c));
  } catch (err) {
    if (err?.status) {
      return { ...headersOf(err.headers), status: err.status, tokens: 0, text: "", error: err.constructor.name };
    }
    return { status: -1, tokens: 0, text: "", error: String(err) };
  }
}

let results;
if (plan.parallel) {
  results = await Promise.all(plan.calls.map(call));
} else {
  results = [];
  for (const c of plan.calls) results.push(await call(c));
}
process.stdout.write(JSON.stringify(results));
