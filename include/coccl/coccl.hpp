// coccl/coccl.hpp: the whole public C++ API of coccl.
//
//   #include <coccl/coccl.hpp>
//   auto id = coccl::UniqueId::create();            // on one rank; ship id.bytes to the others
//   auto comm = coccl::Communicator::create(id, rank, nranks);
//   comm.all_reduce(in, out, n, coccl::DataType::float32, coccl::ReduceOp::sum);
//   auto [ec] = co_await comm.async_all_reduce(in, out, n, coccl::DataType::float32,
//                                              coccl::ReduceOp::sum,
//                                              boost::asio::as_tuple(boost::asio::use_awaitable));
#pragma once

#include <coccl/communicator.hpp>
#include <coccl/error.hpp>
#include <coccl/status.hpp>
#include <coccl/types.hpp>
#include <coccl/unique_id.hpp>
#include <coccl/version.hpp>
