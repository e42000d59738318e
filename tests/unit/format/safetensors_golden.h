// A file the official safetensors writer made, for the writer's and the reader's unit tests.
#pragma once

#include <string>

#include "tests/unit/hex.h"

namespace reshard::testing {

// safetensors 0.6.2 (torch 2.9.1):
//   save_file({'w': torch.tensor([1.0, -2.0]),
//              'b': torch.tensor([1.0, 2.0, 3.0], dtype=torch.bfloat16),
//              'm': torch.tensor([True])}, path, metadata={'format': 'pt'})
inline std::string OfficialSafetensorsFile() {
  return FromHex(
      "c8000000000000007b225f5f6d657461646174615f5f223a7b22666f726d6174223a227074227d2c"
      "2277223a7b226474797065223a22463332222c227368617065223a5b325d2c22646174615f6f6666"
      "73657473223a5b302c385d7d2c2262223a7b226474797065223a2242463136222c22736861706522"
      "3a5b335d2c22646174615f6f666673657473223a5b382c31345d7d2c226d223a7b22647479706522"
      "3a22424f4f4c222c227368617065223a5b315d2c22646174615f6f666673657473223a5b31342c31"
      "355d7d7d202020200000803f000000c0803f0040404001");
}

}  // namespace reshard::testing
