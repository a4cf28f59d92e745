//! The gRPC service: arrow-flight's generic Flight SQL dispatch, plus `GetSchema`, which
//! arrow-flight 58 leaves unimplemented for every Flight SQL server.

use std::sync::Arc;

use arrow_flight::flight_service_server::FlightService;
use arrow_flight::sql::{Any, Command};
use arrow_flight::{
    Action, Criteria, Empty, FlightData, FlightDescriptor, FlightInfo, HandshakeRequest, PollInfo,
    SchemaAsIpc, SchemaResult, Ticket,
};
use datafusion::arrow::ipc::writer::IpcWriteOptions;
use prost::Message;
use tonic::{Request, Response, Status, Streaming};

use super::service::BasinFlightSqlService;

/// Basin's Flight service.
pub struct BasinFlightService(pub(crate) Arc<BasinFlightSqlService>);

type Inner = BasinFlightSqlService;

#[tonic::async_trait]
impl FlightService for BasinFlightService {
    type HandshakeStream = <Inner as FlightService>::HandshakeStream;
    type ListFlightsStream = <Inner as FlightService>::ListFlightsStream;
    type DoGetStream = <Inner as FlightService>::DoGetStream;
    type DoPutStream = <Inner as FlightService>::DoPutStream;
    type DoExchangeStream = <Inner as FlightService>::DoExchangeStream;
    type DoActionStream = <Inner as FlightService>::DoActionStream;
    type ListActionsStream = <Inner as FlightService>::ListActionsStream;

    async fn handshake(
        &self,
        request: Request<Streaming<HandshakeRequest>>,
    ) -> Result<Response<Self::HandshakeStream>, Status> {
        FlightService::handshake(self.0.as_ref(), request).await
    }

    async fn list_flights(
        &self,
        request: Request<Criteria>,
    ) -> Result<Response<Self::ListFlightsStream>, Status> {
        FlightService::list_flights(self.0.as_ref(), request).await
    }

    async fn get_flight_info(
        &self,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        FlightService::get_flight_info(self.0.as_ref(), request).await
    }

    async fn poll_flight_info(
        &self,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<PollInfo>, Status> {
        FlightService::poll_flight_info(self.0.as_ref(), request).await
    }

    async fn get_schema(
        &self,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<SchemaResult>, Status> {
        let any = Any::decode(request.get_ref().cmd.as_ref())
            .map_err(|e| Status::invalid_argument(format!("malformed command: {e}")))?;
        let command = Command::try_from(any)
            .map_err(|e| Status::invalid_argument(format!("malformed command: {e}")))?;
        let schema = self.0.schema_of(command, &request).await?;
        let result = SchemaResult::try_from(SchemaAsIpc::new(&schema, &IpcWriteOptions::default()))
            .map_err(|e| Status::internal(format!("cannot encode the schema: {e}")))?;
        Ok(Response::new(result))
    }

    async fn do_get(
        &self,
        request: Request<Ticket>,
    ) -> Result<Response<Self::DoGetStream>, Status> {
        FlightService::do_get(self.0.as_ref(), request).await
    }

    async fn do_put(
        &self,
        request: Request<Streaming<FlightData>>,
    ) -> Result<Response<Self::DoPutStream>, Status> {
        FlightService::do_put(self.0.as_ref(), request).await
    }

    async fn do_exchange(
        &self,
        request: Request<Streaming<FlightData>>,
    ) -> Result<Response<Self::DoExchangeStream>, Status> {
        FlightService::do_exchange(self.0.as_ref(), request).await
    }

    async fn do_action(
        &self,
        request: Request<Action>,
    ) -> Result<Response<Self::DoActionStream>, Status> {
        FlightService::do_action(self.0.as_ref(), request).await
    }

    async fn list_actions(
        &self,
        request: Request<Empty>,
    ) -> Result<Response<Self::ListActionsStream>, Status> {
        FlightService::list_actions(self.0.as_ref(), request).await
    }
}
