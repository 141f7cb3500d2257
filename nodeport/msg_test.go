package nodeport

import "google.golang.org/protobuf/types/known/emptypb"

// emptyMsg is any proto message: the recorder ignores payloads.
type emptyMsg = emptypb.Empty
