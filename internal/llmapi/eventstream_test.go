package llmapi

import (
	"bytes"
	"encoding/binary"
	"hash/crc32"
	"strings"
	"testing"

	"github.com/slidingratelimit/caddy-sliding-ratelimit/internal/strictnum"
)

const eventStream = "application/vnd.amazon.eventstream"

// header is one header of an event stream frame, already encoded after its
// name: its type byte and value.
type header struct {
	name  string
	value []byte
}

func stringHeader(name, v string) header {
	b := []byte{7, 0, 0}
	binary.BigEndian.PutUint16(b[1:], uint16(len(v)))
	return header{name, append(b, v...)}
}

// encodeFrame builds an event stream frame with correct CRCs.
func encodeFrame(headers []header, payload []byte) []byte {
	var h []byte
	for _, x := range headers {
		h = append(h, byte(len(x.name)))
		h = append(h, x.name...)
		h = append(h, x.value...)
	}
	total := 16 + len(h) + len(payload)
	b := make([]byte, 12, total)
	binary.BigEndian.PutUint32(b[0:], uint32(total))
	binary.BigEndian.PutUint32(b[4:], uint32(len(h)))
	binary.BigEndian.PutUint32(b[8:], crc32.ChecksumIEEE(b[:8]))
	b = append(append(b, h...), payload...)
	return binary.BigEndian.AppendUint32(b, crc32.ChecksumIEEE(b))
}

// frame is a ConverseStream event as Bedrock sends it.
func frame(eventType, payload string) []byte {
	return encodeFrame([]header{
		stringHeader(":event-type", eventType),
		stringHeader(":content-type", "application/json"),
		stringHeader(":message-type", "event"),
	}, []byte(payload))
}

func converseStream() []byte {
	return bytes.Join([][]byte{
		frame("messageStart", `{"role":"assistant"}`),
		frame("contentBlockDelta", `{"contentBlockIndex":0,"delta":{"text":"Hello, \"usage\": {\"totalTokens\": 0}"}}`),
		frame("contentBlockStop", `{"contentBlockIndex":0}`),
		frame("messageStop", `{"stopReason":"end_turn"}`),
		frame("metadata", `{"usage":{"inputTokens":21,"outputTokens":24,"totalTokens":45,"cacheReadInputTokens":5},"metrics":{"latencyMs":596}}`),
	}, nil)
}

// TestEventStreamVector: the encoder here matches AWS's own test vector
// (aws-c-event-stream, encoded/positive/empty_message).
func TestEventStreamVector(t *testing.T) {
	want := []byte{0, 0, 0, 0x10, 0, 0, 0, 0, 0x05, 0xc2, 0x48, 0xeb, 0x7d, 0x98, 0xc8, 0xff}
	if got := encodeFrame(nil, nil); !bytes.Equal(got, want) {
		t.Fatalf("empty frame % x, want % x", got, want)
	}
	u := NewUsageReader(BedrockConverse, eventStream, "")
	u.Write(want)
	if _, why := u.Usage(); why != strictnum.Missing {
		t.Errorf("an empty frame: %q, want %q", why, strictnum.Missing)
	}
}

func TestEventStream(t *testing.T) {
	stream := converseStream()
	want := Usage{Input: 21, Cached: 5, Output: 24, Reported: 45}
	metadata := frame("metadata", `{"usage":{"inputTokens":21,"outputTokens":24,"totalTokens":45}}`)
	allTypes := encodeFrame([]header{
		{"t", []byte{0}}, {"f", []byte{1}}, {"b", []byte{2, 9}}, {"s", []byte{3, 0, 1}},
		{"i", []byte{4, 0, 0, 0, 1}}, {"l", []byte{5, 0, 0, 0, 0, 0, 0, 0, 1}},
		{"y", []byte{6, 0, 2, 'h', 'i'}}, {"d", []byte{8, 0, 0, 0, 0, 0, 0, 0, 1}},
		{"u", append([]byte{9}, make([]byte, 16)...)},
		stringHeader(":event-type", "metadata"),
	}, []byte(`{"usage":{"inputTokens":1,"outputTokens":2,"totalTokens":3}}`))
	badPrelude := bytes.Clone(metadata)
	badPrelude[9] ^= 1
	badMessage := bytes.Clone(metadata)
	badMessage[len(badMessage)-1] ^= 1
	badPayload := bytes.Clone(metadata)
	badPayload[len(badPayload)-10] ^= 1
	badHeaderType := encodeFrame([]header{{"x", []byte{42}}, stringHeader(":event-type", "metadata")}, []byte(`{"usage":{"totalTokens":3}}`))
	huge := frame("contentBlockDelta", `{"delta":{"text":"`+strings.Repeat("x", 100<<10)+`"}}`)
	hugeMetadata := frame("metadata", `{"usage":{"inputTokens":1,"outputTokens":2,"totalTokens":3},"metrics":{"x":"`+strings.Repeat("x", 70<<10)+`"}}`)
	exception := encodeFrame([]header{stringHeader(":message-type", "exception"), stringHeader(":event-type", "metadata")}, []byte(`{"usage":{"totalTokens":3}}`))
	cases := []struct {
		name        string
		contentType string
		body        []byte
		want        Usage
		why         string
	}{
		{"a ConverseStream", eventStream, stream, want, ""},
		{"typed otherwise, told by its first byte", "application/octet-stream", stream, want, ""},
		{"every header type", eventStream, allTypes, Usage{Input: 1, Output: 2, Reported: 3}, ""},
		{"a large frame that is not metadata is skipped", eventStream, append(huge, metadata...), Usage{Input: 21, Output: 24, Reported: 45}, ""},
		{"a metadata frame too large is not read", eventStream, hugeMetadata, Usage{}, strictnum.Missing},
		{"an exception is no metadata", eventStream, exception, Usage{}, strictnum.Missing},
		{"a bad prelude CRC", eventStream, badPrelude, Usage{}, BadFrame},
		{"a bad message CRC", eventStream, badMessage, Usage{}, BadFrame},
		{"a payload changed", eventStream, badPayload, Usage{}, BadFrame},
		{"a bad frame after the usage", eventStream, append(bytes.Clone(stream), badMessage...), Usage{}, BadFrame},
		{"an unknown header type", eventStream, badHeaderType, Usage{}, BadFrame},
		{"a frame cut short", eventStream, stream[:len(stream)-3], Usage{}, strictnum.Missing},
		{"a length too small", eventStream, encodeBadLength(8), Usage{}, BadFrame},
		{"a length too large", eventStream, encodeBadLength(maxFrame + 1), Usage{}, BadFrame},
		{"a JSON document", eventStream, []byte(`{"usage": {"inputTokens": 1}}`), Usage{}, BadFrame},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			whole := NewUsageReader(BedrockConverse, c.contentType, "")
			whole.Write(c.body)
			bytewise := NewUsageReader(BedrockConverse, c.contentType, "")
			for i := range c.body {
				bytewise.Write(c.body[i : i+1])
			}
			for name, u := range map[string]*UsageReader{"one write": whole, "1-byte writes": bytewise} {
				if got, why := u.Usage(); got != c.want || why != c.why {
					t.Errorf("%s: %+v %q, want %+v %q", name, got, why, c.want, c.why)
				}
			}
		})
	}
}

// encodeBadLength is a prelude with a good CRC and a total length of n.
func encodeBadLength(n uint32) []byte {
	b := make([]byte, 12)
	binary.BigEndian.PutUint32(b[0:], n)
	binary.BigEndian.PutUint32(b[8:], crc32.ChecksumIEEE(b[:8]))
	return b
}

// TestEventStreamKeepsLittle: a long stream of content frames passes
// through without an allocation per write.
func TestEventStreamKeepsLittle(t *testing.T) {
	delta := frame("contentBlockDelta", `{"contentBlockIndex":0,"delta":{"text":"Hello"}}`)
	u := NewUsageReader(BedrockConverse, eventStream, "")
	u.Write(delta)
	if allocs := testing.AllocsPerRun(100, func() { u.Write(delta) }); allocs != 0 {
		t.Errorf("%v allocations per frame, want 0", allocs)
	}
}
