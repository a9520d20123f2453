package limiter

import "strings"

// clusterSlots is how many hash slots Redis Cluster has.
const clusterSlots = 16384

// hashSlot returns the Redis Cluster slot of key: the CRC16 of its hash tag
// (the part between the first '{' and the next '}', when not empty) or of
// the whole key.
func hashSlot(key string) uint16 {
	if s := strings.IndexByte(key, '{'); s >= 0 {
		if e := strings.IndexByte(key[s+1:], '}'); e > 0 {
			key = key[s+1 : s+1+e]
		}
	}
	return crc16(key) % clusterSlots
}

// crc16 is CRC-16/XMODEM, the checksum Redis Cluster hashes keys with.
func crc16(s string) uint16 {
	var crc uint16
	for i := 0; i < len(s); i++ {
		crc ^= uint16(s[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc
}
