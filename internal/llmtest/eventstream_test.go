package llmtest

import (
	"bytes"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"io"
	"testing"
)

// TestEventStreamRoundTrip: a message decodes back to its headers and
// payload, its lengths and both CRCs as the format defines them.
func TestEventStreamRoundTrip(t *testing.T) {
	payload := []byte(`{"contentBlockIndex":0,"delta":{"text":"Hel"},"p":"abc"}`)
	headers := []EventHeader{{":event-type", "contentBlockDelta"}, {":content-type", "application/json"}, {":message-type", "event"}}
	msg := AppendEventMessage([]byte("before"), headers, payload)
	if !bytes.HasPrefix(msg, []byte("before")) {
		t.Fatal("AppendEventMessage did not append")
	}
	msg = msg[len("before"):]

	// The prelude and the CRCs, read by hand.
	total, headersLen := binary.BigEndian.Uint32(msg), binary.BigEndian.Uint32(msg[4:])
	wantHeaders := 0
	for _, h := range headers {
		wantHeaders += 1 + len(h.Name) + 1 + 2 + len(h.Value)
	}
	if int(total) != len(msg) || int(headersLen) != wantHeaders || len(msg) != 12+wantHeaders+len(payload)+4 {
		t.Fatalf("lengths %d and %d for a message of %d bytes, want %d headers bytes", total, headersLen, len(msg), wantHeaders)
	}
	if got := binary.BigEndian.Uint32(msg[8:]); got != crc32.ChecksumIEEE(msg[:8]) {
		t.Errorf("prelude CRC %08x, want %08x", got, crc32.ChecksumIEEE(msg[:8]))
	}
	if got := binary.BigEndian.Uint32(msg[len(msg)-4:]); got != crc32.ChecksumIEEE(msg[:len(msg)-4]) {
		t.Errorf("message CRC %08x, want %08x", got, crc32.ChecksumIEEE(msg[:len(msg)-4]))
	}
	// The first header as the format lays it out.
	h := msg[12:]
	if h[0] != byte(len(":event-type")) || string(h[1:12]) != ":event-type" || h[12] != 7 || binary.BigEndian.Uint16(h[13:]) != uint16(len("contentBlockDelta")) {
		t.Errorf("first header % x", h[:16])
	}

	m, err := ReadEventMessage(bytes.NewReader(msg))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(m.Payload, payload) || len(m.Headers) != 3 || m.Headers[":event-type"] != "contentBlockDelta" ||
		m.Headers[":content-type"] != "application/json" || m.Headers[":message-type"] != "event" {
		t.Errorf("decoded %q %q", m.Headers, m.Payload)
	}
}

// TestEventStreamChecks: a message whose prelude or body is changed fails
// its CRC; one cut short is an unexpected EOF; a stream read to its end
// is io.EOF.
func TestEventStreamChecks(t *testing.T) {
	msg := bedrockEvent("messageStop", []byte(`{"stopReason":"end_turn"}`))
	for _, at := range []int{2, 9, 20, len(msg) - 6, len(msg) - 1} {
		bad := bytes.Clone(msg)
		bad[at] ^= 0x10
		if _, err := ReadEventMessage(bytes.NewReader(bad)); err == nil {
			t.Errorf("byte %d changed: no error", at)
		} else if at != 2 && !errors.Is(err, ErrEventCRC) {
			// A changed length may fail its bounds check first.
			t.Errorf("byte %d changed: %v, want a CRC mismatch", at, err)
		}
	}
	if _, err := ReadEventMessage(bytes.NewReader(msg[:len(msg)-3])); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Errorf("cut short: %v", err)
	}
	two := append(bytes.Clone(msg), bedrockEvent("metadata", []byte(`{}`))...)
	r := bytes.NewReader(two)
	for _, want := range []string{"messageStop", "metadata"} {
		if m, err := ReadEventMessage(r); err != nil || m.Headers[":event-type"] != want {
			t.Fatalf("%q, %v: want %s", m.Headers, err, want)
		}
	}
	if _, err := ReadEventMessage(r); err != io.EOF {
		t.Errorf("at the end: %v, want io.EOF", err)
	}
}

// TestEventStreamOtherHeaderTypes: headers of the other value types are
// skipped over, the string ones still read.
func TestEventStreamOtherHeaderTypes(t *testing.T) {
	var h []byte
	h = append(h, 4, 'b', 'o', 'o', 'l', 0)
	h = append(h, 3, 'i', '3', '2', 4, 0, 0, 0, 42)
	h = append(h, 4, 'u', 'u', 'i', 'd', 9)
	h = append(h, make([]byte, 16)...)
	h = append(h, 1, 's', 7, 0, 2, 'o', 'k')
	var msg []byte
	msg = binary.BigEndian.AppendUint32(msg, uint32(12+len(h)+4))
	msg = binary.BigEndian.AppendUint32(msg, uint32(len(h)))
	msg = binary.BigEndian.AppendUint32(msg, crc32.ChecksumIEEE(msg))
	msg = append(msg, h...)
	msg = binary.BigEndian.AppendUint32(msg, crc32.ChecksumIEEE(msg))
	m, err := ReadEventMessage(bytes.NewReader(msg))
	if err != nil || len(m.Headers) != 1 || m.Headers["s"] != "ok" || len(m.Payload) != 0 {
		t.Errorf("%q %q, %v", m.Headers, m.Payload, err)
	}
}

// TestEventStreamEmptyMessageVector: the empty message is byte for byte
// the encoded/positive/empty_message vector of AWS's event stream tests.
func TestEventStreamEmptyMessageVector(t *testing.T) {
	want := []byte{0x00, 0x00, 0x00, 0x10, 0x00, 0x00, 0x00, 0x00, 0x05, 0xc2, 0x48, 0xeb, 0x7d, 0x98, 0xc8, 0xff}
	if got := AppendEventMessage(nil, nil, nil); !bytes.Equal(got, want) {
		t.Errorf("% x, want % x", got, want)
	}
	if m, err := ReadEventMessage(bytes.NewReader(want)); err != nil || len(m.Headers) != 0 || len(m.Payload) != 0 {
		t.Errorf("%+v, %v", m, err)
	}
}
