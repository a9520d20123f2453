package llmapi

import (
	"encoding/binary"
	"hash/crc32"
)

// AWS's event stream (application/vnd.amazon.eventstream), as Bedrock's
// ConverseStream sends it: a sequence of binary frames,
//
//	total length   uint32, big-endian, the whole frame
//	headers length uint32, big-endian
//	prelude CRC    uint32, CRC-32 (IEEE) of the 8 bytes above
//	headers        each: name length uint8, name, type uint8, value
//	payload        total - headers - 16 bytes
//	message CRC    uint32, CRC-32 (IEEE) of all the frame before it
//
// read as the bytes pass, keeping the prelude, the headers (when they fit
// in maxFrameHeaders) and the payload of a metadata frame (when it fits in
// maxMetadata); any other frame is skipped as it passes. A bad CRC or a
// malformed frame leaves the usage unknown (BadFrame).
const (
	// maxFrame is the largest frame AWS sends (16 MiB).
	maxFrame = 16 << 20
	// maxFrameHeaders is the most of a frame's headers kept: a frame with
	// more is not a metadata frame to this reader.
	maxFrameHeaders = 512
	// maxMetadata is the largest metadata payload read (Bedrock's are a
	// few hundred bytes).
	maxMetadata = 64 << 10
)

// frameReader reads an event stream's frames.
type frameReader struct {
	section uint8
	// have counts the bytes read of the section.
	have                          int
	total, headersLen, payloadLen int
	crc                           uint32
	small                         [12]byte
	headers                       [maxFrameHeaders]byte
	// keep is set for a metadata frame, whose payload is kept.
	keep    bool
	payload []byte
	bad     bool
	// scratch holds the bytes being summed: crc32.Update would make the
	// caller's slice escape to the heap.
	scratch [512]byte
}

const (
	framePrelude uint8 = iota
	frameHeaders
	framePayload
	frameCRC
)

// write reads b up to the end of the first metadata frame it completes,
// and returns the bytes it read and that frame's payload, its CRC checked
// (nil when no metadata frame ends in b). The payload is the reader's
// until the next write.
func (f *frameReader) write(b []byte) (int, []byte) {
	all := len(b)
	for len(b) > 0 && !f.bad {
		switch f.section {
		case framePrelude:
			n := copy(f.small[f.have:12], b)
			f.have, b = f.have+n, b[n:]
			if f.have < 12 {
				return all, nil
			}
			f.total = int(binary.BigEndian.Uint32(f.small[0:4]))
			f.headersLen = int(binary.BigEndian.Uint32(f.small[4:8]))
			if crc32.ChecksumIEEE(f.small[:8]) != binary.BigEndian.Uint32(f.small[8:12]) ||
				f.total < 16 || f.total > maxFrame || f.headersLen > f.total-16 {
				f.bad = true
				return all, nil
			}
			f.payloadLen = f.total - 16 - f.headersLen
			f.crc = crc32.Update(0, crc32.IEEETable, f.small[:12])
			f.section, f.have = frameHeaders, 0
		case frameHeaders:
			n := min(len(b), f.headersLen-f.have)
			f.sum(b[:n])
			if f.headersLen <= maxFrameHeaders {
				copy(f.headers[f.have:], b[:n])
			}
			f.have, b = f.have+n, b[n:]
			if f.have < f.headersLen {
				return all, nil
			}
			f.keep = false
			if f.headersLen <= maxFrameHeaders {
				metadata, ok := isMetadata(f.headers[:f.headersLen])
				if !ok {
					f.bad = true
					return all, nil
				}
				f.keep = metadata && f.payloadLen <= maxMetadata
			}
			if f.keep && cap(f.payload) < f.payloadLen {
				f.payload = make([]byte, 0, f.payloadLen)
			}
			f.payload = f.payload[:0]
			f.section, f.have = framePayload, 0
		case framePayload:
			n := min(len(b), f.payloadLen-f.have)
			f.sum(b[:n])
			if f.keep {
				f.payload = append(f.payload, b[:n]...)
			}
			f.have, b = f.have+n, b[n:]
			if f.have < f.payloadLen {
				return all, nil
			}
			f.section, f.have = frameCRC, 0
		case frameCRC:
			n := copy(f.small[f.have:4], b)
			f.have, b = f.have+n, b[n:]
			if f.have < 4 {
				return all, nil
			}
			if binary.BigEndian.Uint32(f.small[:4]) != f.crc {
				f.bad = true
				return all, nil
			}
			f.section, f.have = framePrelude, 0
			if f.keep {
				return all - len(b), f.payload
			}
		}
	}
	return all, nil
}

// sum adds b to the frame's CRC.
func (f *frameReader) sum(b []byte) {
	for len(b) > 0 {
		n := copy(f.scratch[:], b)
		f.crc = crc32.Update(f.crc, crc32.IEEETable, f.scratch[:n])
		b = b[n:]
	}
}

// isMetadata reads a frame's headers: metadata is true when its
// :event-type is "metadata" (and its :message-type, if any, "event"); ok is
// false when the headers are malformed.
func isMetadata(h []byte) (metadata, ok bool) {
	event := true
	for len(h) > 0 {
		n := int(h[0])
		if len(h) < 1+n+1 {
			return false, false
		}
		name, typ := h[1:1+n], h[1+n]
		h = h[2+n:]
		var size int
		switch typ {
		case 0, 1: // bool true, false
		case 2: // byte
			size = 1
		case 3: // int16
			size = 2
		case 4: // int32
			size = 4
		case 5, 8: // int64, timestamp
			size = 8
		case 9: // uuid
			size = 16
		case 6, 7: // bytes, string: uint16 length, then the bytes
			if len(h) < 2 {
				return false, false
			}
			size = 2 + int(binary.BigEndian.Uint16(h))
		default:
			return false, false
		}
		if len(h) < size {
			return false, false
		}
		if typ == 7 {
			if string(name) == ":event-type" {
				metadata = string(h[2:size]) == "metadata"
			} else if string(name) == ":message-type" {
				event = string(h[2:size]) == "event"
			}
		}
		h = h[size:]
	}
	return metadata && event, true
}
