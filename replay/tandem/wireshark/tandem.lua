-- tandem.lua: Wireshark/tshark dissector for tandem's device log (devices.pcapng).
--
-- Installed by `tandem wireshark install` into Wireshark's personal Lua plugins folder,
-- or loaded for one run with `tshark -X lua_script:tandem.lua -r devices.pcapng`.
-- The format is docs/formats.md's. What this decodes:
--   serial (link type USER0), block (USER1), rng (USER2), state (USER3): format 2's
--     16-byte record header (format, flags, header length, instruction count), then the
--     payload: serial bytes, a block request (op, offset, length, data), entropy, or a
--     state checkpoint (per vCPU: its index and its registers, each a width and its
--     bytes; their names are in the interface's comment, which dissectors cannot see);
--   net (Ethernet): Wireshark's own dissectors decode the frame; a `tandem` tree beside it
--     gives the channel, direction and VM time. The instruction count of a net frame is in
--     a pcapng custom option, which Wireshark (4.0) does not show to dissectors.
-- Fields: tandem.channel, tandem.kind, tandem.direction, tandem.vm_ns, tandem.icount,
-- tandem.continued, tandem.serial.text, tandem.block.op, tandem.block.offset,
-- tandem.block.length, tandem.rng.length, ... e.g.
--   tshark -r devices.pcapng -Y 'tandem.block.offset > 0x100000'

local tandem = Proto("tandem", "tandem device log")

local OPS = { [1] = "write", [2] = "flush", [3] = "discard", [4] = "write-zeroes" }
local FORMAT, REC_HDR_LEN, BLOCK_HDR_LEN = 2, 16, 24

local f = {
    channel = ProtoField.string("tandem.channel", "Channel"),
    kind = ProtoField.string("tandem.kind", "Kind"),
    direction = ProtoField.string("tandem.direction", "Direction (in: into the guest)"),
    vm_ns = ProtoField.uint64("tandem.vm_ns", "VM clock (ns)"),
    format = ProtoField.uint8("tandem.format", "Record format"),
    flags = ProtoField.uint8("tandem.flags", "Record flags", base.HEX),
    continued = ProtoField.bool("tandem.continued", "Continued in the next record", 8, nil, 0x01),
    has_icount = ProtoField.bool("tandem.has_icount", "Instruction count present", 8, nil, 0x02),
    hdr_len = ProtoField.uint16("tandem.header_length", "Record header length"),
    icount = ProtoField.uint64("tandem.icount", "Instruction count"),
    serial_text = ProtoField.string("tandem.serial.text", "Text"),
    serial_length = ProtoField.uint32("tandem.serial.length", "Length"),
    block_op = ProtoField.uint8("tandem.block.op", "Operation", base.DEC, OPS),
    block_offset = ProtoField.uint64("tandem.block.offset", "Offset", base.HEX),
    block_length = ProtoField.uint64("tandem.block.length", "Length"),
    block_data = ProtoField.bytes("tandem.block.data", "Data"),
    rng_length = ProtoField.uint32("tandem.rng.length", "Length"),
    rng_data = ProtoField.bytes("tandem.rng.data", "Entropy"),
    state_cpu = ProtoField.uint32("tandem.state.cpu", "vCPU"),
    state_registers = ProtoField.uint32("tandem.state.registers", "Registers"),
    state_register = ProtoField.bytes("tandem.state.register", "Register"),
}
tandem.fields = {}
for _, field in pairs(f) do table.insert(tandem.fields, field) end

local iface_name = Field.new("frame.interface_name")
local iface_description = Field.new("frame.interface_description")
local time_epoch = Field.new("frame.time_epoch")

local ENCAP_USER0 = (wtap_encaps and wtap_encaps.USER0) or 45
local KIND_OF_ENCAP = { [ENCAP_USER0] = "serial", [ENCAP_USER0 + 1] = "block", [ENCAP_USER0 + 2] = "rng",
                        [ENCAP_USER0 + 3] = "state" }

local function direction(pinfo)
    -- epb_flags inbound (1) is P2P_DIR_RECV, outbound (2) P2P_DIR_SENT
    if pinfo.p2p_dir == 1 then return "in" elseif pinfo.p2p_dir == 0 then return "out" end
    return "?"
end

local function vm_ns(pinfo)
    local t = time_epoch()
    if t then return UInt64(t.value.secs) * 1000000000 + t.value.nsecs end
    return UInt64(string.format("%.0f", pinfo.abs_ts * 1e9))
end

local function channel(kind)
    local n = iface_name()
    return n and tostring(n.value) or kind
end

-- The channel, kind, direction and VM time every record has.
local function common(tree, pinfo, kind)
    local name = channel(kind)
    tree:add(f.channel, name):set_generated()
    tree:add(f.kind, kind):set_generated()
    tree:add(f.direction, direction(pinfo)):set_generated()
    tree:add(f.vm_ns, vm_ns(pinfo)):set_generated()
    return name
end

local function printable(s)
    return (s:gsub("[%c\127-\255]", function(c)
        if c == "\n" then return "\\n" elseif c == "\r" then return "\\r" elseif c == "\t" then return "\\t" end
        return string.format("\\x%02x", c:byte())
    end))
end

-- Format 2's record header, if the record has one (format 1 records do not).
local function record_header(tvb, tree)
    if tvb:len() < REC_HDR_LEN or tvb(0, 1):uint() ~= FORMAT or tvb(2, 2):le_uint() ~= REC_HDR_LEN then
        return 0, false
    end
    local h = tree:add(tandem, tvb(0, REC_HDR_LEN), "Record header")
    h:add(f.format, tvb(0, 1))
    local fl = h:add(f.flags, tvb(1, 1))
    fl:add(f.continued, tvb(1, 1))
    fl:add(f.has_icount, tvb(1, 1))
    h:add_le(f.hdr_len, tvb(2, 2))
    if bit32.band(tvb(1, 1):uint(), 2) ~= 0 then
        tree:add_le(f.icount, tvb(8, 8))
    end
    return REC_HDR_LEN, bit32.band(tvb(1, 1):uint(), 1) ~= 0
end

local function serial(tvb, pinfo, tree, name, dir, cont)
    local text = tvb:len() > 0 and printable(tvb:raw()) or ""
    tree:add(f.serial_length, tvb:len()):set_generated()
    if tvb:len() > 0 then tree:add(f.serial_text, tvb(), text) end
    local shown = #text > 100 and text:sub(1, 100) .. "..." or text
    return string.format("%s %s: %s", name, dir, shown)
end

local function block(tvb, pinfo, tree, name, dir, cont)
    if tvb:len() < BLOCK_HDR_LEN then
        return string.format("%s: block record of %d bytes, shorter than its header", name, tvb:len())
    end
    local op = tvb(0, 1):uint()
    tree:add(f.block_op, tvb(0, 1))
    tree:add_le(f.block_offset, tvb(8, 8))
    tree:add_le(f.block_length, tvb(16, 8))
    if tvb:len() > BLOCK_HDR_LEN then tree:add(f.block_data, tvb(BLOCK_HDR_LEN)) end
    return string.format("%s %s offset 0x%s length %s", name, OPS[op] or ("op " .. op),
                         tvb(8, 8):le_uint64():tohex():gsub("^0+(.)", "%1"), tostring(tvb(16, 8):le_uint64()))
end

local function rng(tvb, pinfo, tree, name, dir, cont)
    tree:add(f.rng_length, tvb:len()):set_generated()
    if tvb:len() > 0 then tree:add(f.rng_data, tvb()) end
    return string.format("%s %s: %d bytes of entropy", name, dir, tvb:len())
end

local function state(tvb, pinfo, tree, name, dir, cont)
    local off, cpus = 0, 0
    while off + 8 <= tvb:len() do
        local len = tvb(off + 4, 4):le_uint()
        if off + 8 + len > tvb:len() then break end
        local c = tree:add(tandem, tvb(off, 8 + len), "vCPU " .. tvb(off, 4):le_uint())
        c:add_le(f.state_cpu, tvb(off, 4))
        local r, n = off + 8, 0
        while r < off + 8 + len do
            local w = tvb(r, 1):uint()
            if r + 1 + w > off + 8 + len then break end
            if w > 0 then c:add(f.state_register, tvb(r + 1, w)) end
            r, n = r + 1 + w, n + 1
        end
        c:add(f.state_registers, n):set_generated()
        off, cpus = off + 8 + len, cpus + 1
    end
    return string.format("%s: state checkpoint, %d vCPU%s", name, cpus, cpus == 1 and "" or "s")
end

local DECODE = { serial = serial, block = block, rng = rng, state = state }

function tandem.dissector(tvb, pinfo, root)
    local kind = KIND_OF_ENCAP[pinfo.match_uint]
    if not kind then return 0 end
    pinfo.cols.protocol = kind
    local tree = root:add(tandem, tvb(), "tandem " .. kind .. " record")
    local name = common(tree, pinfo, kind)
    local hlen, cont = record_header(tvb, tree)
    local info = DECODE[kind](tvb(hlen):tvb(), pinfo, tree, name, direction(pinfo), cont)
    if cont then info = info .. " (continued)" end
    pinfo.cols.info = info
    return tvb:len()
end

local encaps = DissectorTable.get("wtap_encap")
for encap, _ in pairs(KIND_OF_ENCAP) do encaps:add(encap, tandem) end

-- Net frames: Wireshark's Ethernet dissector has them; add tandem's view beside it.
local tandem_net = Proto("tandem_net", "tandem device log (net)")

function tandem_net.dissector(tvb, pinfo, root)
    local d = iface_description()
    if not d or tostring(d.value) ~= "net" or KIND_OF_ENCAP[pinfo.match_uint] then return end
    local tree = root:add(tandem, tvb(), "tandem net record")
    common(tree, pinfo, "net")
end

register_postdissector(tandem_net)
