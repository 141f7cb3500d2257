package tlsutil

import (
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"strings"
)

// GossipKeySize is the length of a generated gossip key: AES-256.
const GossipKeySize = 32

// ParseGossipKey decodes a base64 serf/memberlist encryption key. memberlist
// accepts AES-128, -192 and -256 keys (16, 24 or 32 bytes).
func ParseGossipKey(s string) ([]byte, error) {
	k, err := base64.StdEncoding.DecodeString(strings.TrimSpace(s))
	if err != nil {
		return nil, fmt.Errorf("gossip key: not base64: %w (generate one with `tollgate tls gossip-key`)", err)
	}
	switch len(k) {
	case 16, 24, 32:
		return k, nil
	}
	return nil, fmt.Errorf("gossip key: %d bytes after base64 decoding, want 32 (or 16/24)", len(k))
}

// ReadGossipKeyring reads a keyring file: one base64 key per line (blank lines
// and #-comments ignored), or serf's JSON keyring format (a list of base64
// strings). The first key encrypts; every key decrypts, so a key can be
// rotated by adding the new one second, then first, then removing the old one.
func ReadGossipKeyring(path string) ([][]byte, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("gossip keyring: %w", err)
	}
	var encoded []string
	if t := strings.TrimSpace(string(data)); strings.HasPrefix(t, "[") {
		if err := json.Unmarshal([]byte(t), &encoded); err != nil {
			return nil, fmt.Errorf("gossip keyring %s: JSON: %w", path, err)
		}
	} else {
		for _, line := range strings.Split(t, "\n") {
			if line = strings.TrimSpace(line); line != "" && !strings.HasPrefix(line, "#") {
				encoded = append(encoded, line)
			}
		}
	}
	if len(encoded) == 0 {
		return nil, fmt.Errorf("gossip keyring %s: no key", path)
	}
	keys := make([][]byte, len(encoded))
	for i, e := range encoded {
		k, err := ParseGossipKey(e)
		if err != nil {
			return nil, fmt.Errorf("gossip keyring %s: key %d: %w", path, i+1, err)
		}
		keys[i] = k
	}
	return keys, nil
}

// NewGossipKey returns a fresh random 32-byte key, base64-encoded.
func NewGossipKey() (string, error) {
	k := make([]byte, GossipKeySize)
	if _, err := rand.Read(k); err != nil {
		return "", fmt.Errorf("gossip key: %w", err)
	}
	return base64.StdEncoding.EncodeToString(k), nil
}
