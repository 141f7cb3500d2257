package ratelease

import "math/rand/v2"

func randomID() uint64 {
	for {
		if id := rand.Uint64(); id != 0 {
			return id
		}
	}
}
