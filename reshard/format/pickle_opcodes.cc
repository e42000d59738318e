#include "reshard/format/pickle_opcodes.h"

namespace reshard::format {

std::string_view PickleOpName(uint8_t byte) {
  // A switch over the enum (not a table) lets -Wswitch flag an enumerator without a name.
  switch (static_cast<PickleOp>(byte)) {
    case PickleOp::kMark: return "MARK";
    case PickleOp::kStop: return "STOP";
    case PickleOp::kPop: return "POP";
    case PickleOp::kDup: return "DUP";
    case PickleOp::kFloat: return "FLOAT";
    case PickleOp::kInt: return "INT";
    case PickleOp::kLong: return "LONG";
    case PickleOp::kNone: return "NONE";
    case PickleOp::kPersId: return "PERSID";
    case PickleOp::kReduce: return "REDUCE";
    case PickleOp::kString: return "STRING";
    case PickleOp::kUnicode: return "UNICODE";
    case PickleOp::kAppend: return "APPEND";
    case PickleOp::kBuild: return "BUILD";
    case PickleOp::kGlobal: return "GLOBAL";
    case PickleOp::kDict: return "DICT";
    case PickleOp::kGet: return "GET";
    case PickleOp::kInst: return "INST";
    case PickleOp::kList: return "LIST";
    case PickleOp::kPut: return "PUT";
    case PickleOp::kSetItem: return "SETITEM";
    case PickleOp::kTuple: return "TUPLE";
    case PickleOp::kEmptyTuple: return "EMPTY_TUPLE";
    case PickleOp::kPopMark: return "POP_MARK";
    case PickleOp::kBinFloat: return "BINFLOAT";
    case PickleOp::kBinInt: return "BININT";
    case PickleOp::kBinInt1: return "BININT1";
    case PickleOp::kBinInt2: return "BININT2";
    case PickleOp::kBinPersId: return "BINPERSID";
    case PickleOp::kBinString: return "BINSTRING";
    case PickleOp::kShortBinString: return "SHORT_BINSTRING";
    case PickleOp::kBinUnicode: return "BINUNICODE";
    case PickleOp::kEmptyList: return "EMPTY_LIST";
    case PickleOp::kAppends: return "APPENDS";
    case PickleOp::kBinGet: return "BINGET";
    case PickleOp::kLongBinGet: return "LONG_BINGET";
    case PickleOp::kObj: return "OBJ";
    case PickleOp::kBinPut: return "BINPUT";
    case PickleOp::kLongBinPut: return "LONG_BINPUT";
    case PickleOp::kSetItems: return "SETITEMS";
    case PickleOp::kEmptyDict: return "EMPTY_DICT";
    case PickleOp::kProto: return "PROTO";
    case PickleOp::kNewObj: return "NEWOBJ";
    case PickleOp::kExt1: return "EXT1";
    case PickleOp::kExt2: return "EXT2";
    case PickleOp::kExt4: return "EXT4";
    case PickleOp::kTuple1: return "TUPLE1";
    case PickleOp::kTuple2: return "TUPLE2";
    case PickleOp::kTuple3: return "TUPLE3";
    case PickleOp::kNewTrue: return "NEWTRUE";
    case PickleOp::kNewFalse: return "NEWFALSE";
    case PickleOp::kLong1: return "LONG1";
    case PickleOp::kLong4: return "LONG4";
    case PickleOp::kBinBytes: return "BINBYTES";
    case PickleOp::kShortBinBytes: return "SHORT_BINBYTES";
    case PickleOp::kShortBinUnicode: return "SHORT_BINUNICODE";
    case PickleOp::kBinUnicode8: return "BINUNICODE8";
    case PickleOp::kBinBytes8: return "BINBYTES8";
    case PickleOp::kEmptySet: return "EMPTY_SET";
    case PickleOp::kAddItems: return "ADDITEMS";
    case PickleOp::kFrozenSet: return "FROZENSET";
    case PickleOp::kNewObjEx: return "NEWOBJ_EX";
    case PickleOp::kStackGlobal: return "STACK_GLOBAL";
    case PickleOp::kMemoize: return "MEMOIZE";
    case PickleOp::kFrame: return "FRAME";
    case PickleOp::kByteArray8: return "BYTEARRAY8";
    case PickleOp::kNextBuffer: return "NEXT_BUFFER";
    case PickleOp::kReadOnlyBuffer: return "READONLY_BUFFER";
  }
  return "";
}

}  // namespace reshard::format
