// PickleOp: the opcodes of pickle protocols 0 to 5, as their wire bytes.
//
// Each enumerator's value is the byte that introduces the opcode in a pickle stream, so a byte
// read from input is compared to an opcode without a lookup table. Names follow Python's
// pickletools (MARK -> kMark, SHORT_BINUNICODE -> kShortBinUnicode); the comment on each line
// gives the protocol that introduced it and the argument that follows the byte on the wire.
// Integers in arguments are little-endian unless noted.
//
// The enum lists every opcode, including those pickle_reader.h rejects (the text-protocol ones,
// EXT*, out-of-band buffers): an error can then name them, and an unknown byte stays
// distinguishable from a known but unsupported opcode.
//
// Header-only except PickleOpName; no state, thread-safe. Public header: C++17.
#pragma once

#include <cstdint>
#include <string_view>

namespace reshard::format {

enum class PickleOp : uint8_t {
  // Protocol 0 (text). Arguments end with '\n' unless noted.
  kMark = '(',      // push a mark
  kStop = '.',      // end of pickle; the top of the stack is the result
  kPop = '0',       // discard the top item
  kDup = '2',       // push the top item again
  kFloat = 'F',     // decimal float text
  kInt = 'I',       // decimal int text ("00"/"01" are False/True)
  kLong = 'L',      // decimal int text with an optional 'L' suffix
  kNone = 'N',      // push None
  kPersId = 'P',    // persistent id as a text line
  kReduce = 'R',    // callable, args -> callable(*args)
  kString = 'S',    // quoted, escaped bytes text
  kUnicode = 'V',   // raw-unicode-escape text
  kAppend = 'a',    // list, item -> list.append(item)
  kBuild = 'b',     // object, state -> object.__setstate__(state)
  kGlobal = 'c',    // "module\nname\n"
  kDict = 'd',      // mark, k0, v0, ... -> dict
  kGet = 'g',       // decimal memo index text
  kInst = 'i',      // "module\nname\n" plus marked args
  kList = 'l',      // mark, items... -> list
  kPut = 'p',       // decimal memo index text
  kSetItem = 's',   // dict, key, value -> dict[key] = value
  kTuple = 't',     // mark, items... -> tuple

  // Protocol 1 (binary).
  kEmptyTuple = ')',      // push ()
  kPopMark = '1',         // discard the items above the top mark, and the mark
  kBinFloat = 'G',        // 8-byte big-endian IEEE-754 double
  kBinInt = 'J',          // 4-byte signed int
  kBinInt1 = 'K',         // 1-byte unsigned int
  kBinInt2 = 'M',         // 2-byte unsigned int
  kBinPersId = 'Q',       // pid (top of stack) -> persistent_load(pid)
  kBinString = 'T',       // 4-byte signed length, then bytes
  kShortBinString = 'U',  // 1-byte length, then bytes
  kBinUnicode = 'X',      // 4-byte length, then UTF-8
  kEmptyList = ']',       // push []
  kAppends = 'e',         // list, mark, items... -> list.extend(items)
  kBinGet = 'h',          // 1-byte memo index
  kLongBinGet = 'j',      // 4-byte memo index
  kObj = 'o',             // mark, cls, args... -> cls(*args)
  kBinPut = 'q',          // 1-byte memo index
  kLongBinPut = 'r',      // 4-byte memo index
  kSetItems = 'u',        // dict, mark, k0, v0, ... -> dict.update(pairs)
  kEmptyDict = '}',       // push {}

  // Protocol 2.
  kProto = 0x80,     // 1-byte protocol version
  kNewObj = 0x81,    // cls, args -> cls.__new__(cls, *args)
  kExt1 = 0x82,      // 1-byte extension-registry code
  kExt2 = 0x83,      // 2-byte extension-registry code
  kExt4 = 0x84,      // 4-byte extension-registry code
  kTuple1 = 0x85,    // a -> (a,)
  kTuple2 = 0x86,    // a, b -> (a, b)
  kTuple3 = 0x87,    // a, b, c -> (a, b, c)
  kNewTrue = 0x88,   // push True
  kNewFalse = 0x89,  // push False
  kLong1 = 0x8a,     // 1-byte length, then little-endian two's-complement bytes
  kLong4 = 0x8b,     // 4-byte signed length, then little-endian two's-complement bytes

  // Protocol 3.
  kBinBytes = 'B',       // 4-byte length, then bytes
  kShortBinBytes = 'C',  // 1-byte length, then bytes

  // Protocol 4.
  kShortBinUnicode = 0x8c,  // 1-byte length, then UTF-8
  kBinUnicode8 = 0x8d,      // 8-byte length, then UTF-8
  kBinBytes8 = 0x8e,        // 8-byte length, then bytes
  kEmptySet = 0x8f,         // push set()
  kAddItems = 0x90,         // set, mark, items... -> set.update(items)
  kFrozenSet = 0x91,        // mark, items... -> frozenset
  kNewObjEx = 0x92,         // cls, args, kwargs -> cls.__new__(cls, *args, **kwargs)
  kStackGlobal = 0x93,      // module, name (both str) -> global
  kMemoize = 0x94,          // memo[len(memo)] = top of stack
  kFrame = 0x95,            // 8-byte length of the frame that follows

  // Protocol 5.
  kByteArray8 = 0x96,      // 8-byte length, then bytes
  kNextBuffer = 0x97,      // push the next out-of-band buffer
  kReadOnlyBuffer = 0x98,  // make the top buffer read-only
};

// The pickletools name of the opcode whose wire byte is `byte` ("MARK", "SHORT_BINUNICODE"),
// or "" when no opcode of protocols 0 to 5 uses that byte. The view points to static storage.
std::string_view PickleOpName(uint8_t byte);

inline std::string_view PickleOpName(PickleOp op) { return PickleOpName(static_cast<uint8_t>(op)); }

}  // namespace reshard::format
