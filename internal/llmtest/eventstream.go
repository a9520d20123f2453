package llmtest

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
)

// Bedrock streams its answers in AWS's event stream encoding
// (application/vnd.amazon.eventstream): a sequence of binary messages,
// each
//
//	total length    uint32, big-endian: the whole message, these 4 bytes included
//	headers length  uint32
//	prelude CRC     uint32: CRC-32 (IEEE) of the 8 bytes above
//	headers         each: name length (1 byte), name, value type (1 byte),
//	                and for a string (type 7) its length (uint16) and bytes
//	payload         the event's JSON
//	message CRC     uint32: CRC-32 of everything before it
//
// with the headers :message-type ("event"), :event-type (messageStart,
// contentBlockDelta, ...) and :content-type ("application/json").

// EventHeader is a header of an event stream message; the stand-in sends
// string headers only.
type EventHeader struct {
	Name, Value string
}

// EventMessage is a decoded event stream message.
type EventMessage struct {
	// Headers holds the string headers by name; others are skipped.
	Headers map[string]string
	Payload []byte
}

// headerString is the value type of a string header.
const headerString = 7

// AppendEventMessage appends an event stream message of headers and
// payload to dst.
func AppendEventMessage(dst []byte, headers []EventHeader, payload []byte) []byte {
	var h []byte
	for _, header := range headers {
		h = append(h, byte(len(header.Name)))
		h = append(h, header.Name...)
		h = append(h, headerString)
		h = binary.BigEndian.AppendUint16(h, uint16(len(header.Value)))
		h = append(h, header.Value...)
	}
	start := len(dst)
	dst = binary.BigEndian.AppendUint32(dst, uint32(12+len(h)+len(payload)+4))
	dst = binary.BigEndian.AppendUint32(dst, uint32(len(h)))
	dst = binary.BigEndian.AppendUint32(dst, crc32.ChecksumIEEE(dst[start:start+8]))
	dst = append(dst, h...)
	dst = append(dst, payload...)
	return binary.BigEndian.AppendUint32(dst, crc32.ChecksumIEEE(dst[start:]))
}

// bedrockEvent is an event of a Converse stream.
func bedrockEvent(eventType string, payload []byte) []byte {
	return AppendEventMessage(nil, []EventHeader{
		{":event-type", eventType},
		{":content-type", "application/json"},
		{":message-type", "event"},
	}, payload)
}

// ErrEventCRC is the error of a message whose prelude or message CRC does
// not match.
var ErrEventCRC = errors.New("event stream: CRC mismatch")

// ReadEventMessage reads one event stream message from r, checking both
// CRCs; io.EOF when r ends before one starts, io.ErrUnexpectedEOF when it
// ends inside one.
func ReadEventMessage(r io.Reader) (EventMessage, error) {
	var prelude [12]byte
	if _, err := io.ReadFull(r, prelude[:]); err != nil {
		return EventMessage{}, err
	}
	total, headersLen := binary.BigEndian.Uint32(prelude[0:]), binary.BigEndian.Uint32(prelude[4:])
	if crc32.ChecksumIEEE(prelude[:8]) != binary.BigEndian.Uint32(prelude[8:]) {
		return EventMessage{}, fmt.Errorf("%w (prelude)", ErrEventCRC)
	}
	if total < 16 || total > 16<<20 || headersLen > total-16 {
		return EventMessage{}, fmt.Errorf("event stream: lengths %d and %d", total, headersLen)
	}
	msg := make([]byte, total)
	copy(msg, prelude[:])
	if _, err := io.ReadFull(r, msg[12:]); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return EventMessage{}, err
	}
	if crc32.ChecksumIEEE(msg[:total-4]) != binary.BigEndian.Uint32(msg[total-4:]) {
		return EventMessage{}, fmt.Errorf("%w (message)", ErrEventCRC)
	}
	m := EventMessage{Headers: map[string]string{}, Payload: msg[12+headersLen : total-4]}
	h := msg[12 : 12+headersLen]
	for len(h) > 0 {
		n := int(h[0])
		if len(h) < 1+n+1 {
			return m, errors.New("event stream: header cut short")
		}
		name, kind := string(h[1:1+n]), h[1+n]
		h = h[2+n:]
		size, ok := headerValueSize(kind, h)
		if !ok || len(h) < size {
			return m, fmt.Errorf("event stream: header %s of type %d cut short", name, kind)
		}
		if kind == headerString {
			m.Headers[name] = string(h[2:size])
		}
		h = h[size:]
	}
	return m, nil
}

// headerValueSize is the bytes of a header value of type kind at the
// start of h.
func headerValueSize(kind byte, h []byte) (int, bool) {
	switch kind {
	case 0, 1: // true, false
		return 0, true
	case 2: // byte
		return 1, true
	case 3: // int16
		return 2, true
	case 4: // int32
		return 4, true
	case 5, 8: // int64, timestamp
		return 8, true
	case 6, 7: // bytes, string
		if len(h) < 2 {
			return 0, false
		}
		return 2 + int(binary.BigEndian.Uint16(h)), true
	case 9: // uuid
		return 16, true
	}
	return 0, false
}
